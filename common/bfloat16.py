"""bfloat16 without torch: numpy has no such dtype, so it lives as uint16 words.

A bfloat16 is the upper half of an IEEE-754 float32. Converting keeps the
exponent range of float32 and rounds the mantissa to 7 bits, to nearest with
ties to even (what torch and the hardware do), so a delta sent as bfloat16
decodes to the value torch would have produced.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# Any NaN stays a NaN: truncating a NaN whose payload sits only in the low
# mantissa bits would turn it into an infinity, so the quiet bit is forced.
_QUIET_NAN_BIT = np.uint32(0x0040)


def float32_to_bfloat16_bits(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """Round float32 values to bfloat16 (nearest, ties to even); return the bit patterns."""
    # np.array with order="C" keeps 0-d arrays 0-d (ascontiguousarray would not).
    array = np.array(values, dtype=np.float32, order="C", copy=None)
    bits = array.view(np.uint32)
    upper = bits >> np.uint32(16)
    rounding = np.uint32(0x7FFF) + (upper & np.uint32(1))
    with np.errstate(over="ignore"):
        rounded = (bits + rounding) >> np.uint32(16)
    result = np.where(np.isnan(array), upper | _QUIET_NAN_BIT, rounded)
    return result.astype(np.uint16)


def bfloat16_bits_to_float32(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    """Widen bfloat16 bit patterns to float32 exactly (every bfloat16 is a float32)."""
    widened = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return np.array(widened, order="C", copy=None).view(np.float32)
