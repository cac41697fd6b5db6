"""Aggregation math: update weights, norms and clipping, the reductions, the server step.

Pure numpy functions over models given as ``list[np.ndarray]`` in model order.
Inputs may be any real floating dtype; results are float32. Internally every
sum runs in float64 and is rounded once at the end, so a mean of identical
deltas is exactly that delta and a result never leaves the per-coordinate
[min, max] of its inputs by a rounding error.

The robust reductions work coordinate-wise over blocks of coordinates (a (K, B)
float64 buffer, B = 64 Ki), so 8 deltas of 1M parameters need 4 MiB of scratch
instead of stacking every delta, and the sort runs in cache.

The weighted mean runs over the same blocks without stacking them: one
float64 multiply-add per delta into a block-sized sum that stays in cache,
faster than stacking the deltas and with no copy of them, and its
finiteness is checked once, on the result.

ParticipantSums does the part of the work that can be done as updates
arrive: each participant's increments are summed on arrival, so making a
version runs the reduction once over one delta per participant.

The server step is FedAvgM's (Hsu et al., 2019): velocity = momentum *
velocity + aggregate, global += lr * velocity; with momentum 0 it is
FedAvg's global += lr * aggregate exactly, and no velocity is kept.

Weights, FedBuff-style (Nguyen et al., 2022): an update trained on n samples
against a base s versions old weighs min(n, cap) * (1 + s) ** -exponent. The
cap stops one participant from claiming an arbitrary share of the average.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

Float64Array = npt.NDArray[np.float64]

# Coordinates per block: in the coordinate-wise reductions 64 Ki x K=8 x 8 bytes
# = 4 MiB of scratch, small enough to stay in L2/L3 while sorting; in the mean,
# 2 x 512 KiB (measured: 16 Ki blocks no faster, 4 Ki slower).
_BLOCK = 1 << 16


def staleness_weight(staleness: int, *, exponent: float = 0.5) -> float:
    """(1 + s) ** -exponent: FedBuff's polynomial discount of an update s versions old."""
    s = _non_negative_int(staleness, "staleness")
    if not math.isfinite(exponent) or exponent < 0:
        raise ValueError(f"staleness exponent must be finite and >= 0, got {exponent}")
    return float((1.0 + s) ** -exponent)


def update_weight(
    samples: int, staleness: int, *, max_samples: int, exponent: float = 0.5
) -> float:
    """min(samples, max_samples) * staleness_weight: what one update counts in the average."""
    n = _integer(samples, "samples")
    cap = _integer(max_samples, "max_samples")
    if n <= 0:
        raise ValueError(f"an update must be trained on at least one sample, got samples={n}")
    if cap <= 0:
        raise ValueError(f"max_samples must be positive, got {cap}")
    return min(n, cap) * staleness_weight(staleness, exponent=exponent)


def l2_norm(tensors: Sequence[np.ndarray]) -> float:
    """The global L2 norm over all tensors, squares summed in float64 (finite for float32 input)."""
    return math.sqrt(sum(_squared_norm(tensor) for tensor in tensors))


def clip_by_norm(delta: list[np.ndarray], max_norm: float) -> tuple[list[np.ndarray], float]:
    """Scale a delta so its global L2 norm (over all tensors) is at most max_norm.

    Returns (clipped, original_norm). Clipping bounds how far a single update
    can move the model, whatever its sender did. A delta already within the
    bound is returned without a copy when it is float32 already.
    """
    if not math.isfinite(max_norm) or max_norm <= 0:
        raise ValueError(f"max_norm must be finite and positive, got {max_norm}")
    tensors = _float_tensors(delta, "delta")
    for index, tensor in enumerate(tensors):
        _check_finite(tensor, f"delta tensor {index}")
    # Squares of float32 values cannot overflow float64, so the norm is finite.
    norm = l2_norm(tensors)
    if norm <= max_norm:
        return tensors, norm
    scale = max_norm / norm
    return [(t * scale).astype(np.float32) for t in tensors], norm


Reduce = Callable[[Sequence[Sequence[np.ndarray]], Sequence[float]], list[np.ndarray]]
"""A reduction: K deltas and their weights -> one float32 tensor per model tensor."""


def weighted_mean(
    deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
) -> list[np.ndarray]:
    """sum_i w_i * delta_i / sum_i w_i, coordinate by coordinate (FedAvg's mean)."""
    models, w = _validated(deltas, weights)
    w = w / w.sum()
    result: list[np.ndarray] = []
    for index, first in enumerate(models[0]):
        flats = [model[index].reshape(-1) for model in models]
        mean = _weighted_sum(flats, w).reshape(first.shape)
        if not np.isfinite(mean).all():
            bad = next(k for k, flat in enumerate(flats) if not np.isfinite(flat).all())
            raise ValueError(f"delta {bad}, tensor {index}: holds NaN or infinity")
        result.append(mean)
    return result


def trimmed_mean(
    deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float], *, trim_fraction: float
) -> list[np.ndarray]:
    """Per coordinate, floor(trim_fraction * K) smallest and largest values cut, the rest
    averaged with their weights.

    Values are cut by count, so an outlier goes however much weight it
    claims. Ties are broken by weight, which makes the result independent
    of update order.
    """
    check_trim_fraction(trim_fraction)
    models, w = _validated(deltas, weights)
    count = len(models)
    cut = math.floor(trim_fraction * count)
    # Rows in ascending weight order; the stable sort below then keeps
    # equal values in weight order, so which of them is cut never depends
    # on the order the updates arrived in.
    by_weight = np.argsort(w, kind="stable")
    models = [models[i] for i in by_weight]
    w = w[by_weight]

    def kernel(block: Float64Array) -> Float64Array:
        order = np.argsort(block, axis=0, kind="stable")[cut : count - cut]
        kept = np.take_along_axis(block, order, axis=0)
        kept_w = w[order]
        total: Float64Array = (kept * kept_w).sum(axis=0) / kept_w.sum(axis=0)
        return total

    return _blockwise(models, kernel)


def check_trim_fraction(trim_fraction: float) -> None:
    """Refuse a fraction that would trim every value (or is not a number)."""
    if not (math.isfinite(trim_fraction) and 0 <= trim_fraction < 0.5):
        raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")


def median(deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list[np.ndarray]:
    """The median of each coordinate's values; the weights are checked, then ignored.

    With an even count it is the mean of the two middle values.
    """
    models, _ = _validated(deltas, weights)
    low, high = (len(models) - 1) // 2, len(models) // 2

    def kernel(block: Float64Array) -> Float64Array:
        # A full sort of K rows beats np.median's partition here (3x at
        # K=8): numpy partitions each short column separately.
        ordered = np.sort(block, axis=0)
        middle: Float64Array = (ordered[low] + ordered[high]) * 0.5
        return middle

    return _blockwise(models, kernel)


class ParticipantSums:
    """A buffer's updates, each participant's increments and weights summed on arrival.

    Clients push incremental deltas (progress since their previous push), so
    a participant's buffered updates add up to its progress since the first
    of them; the reduction then combines participants. Averaging them as
    separate updates would apply 1/K of a lone participant's progress and let
    one who pushes often count several times in a robust reduction.
    """

    def __init__(self, reduce: Reduce) -> None:
        self._reduce = reduce
        self._sums: dict[str, tuple[list[np.ndarray], float]] = {}

    def add(self, participant_id: str, delta: Sequence[np.ndarray], weight: float) -> None:
        """Add the delta to its participant's running sum (float32, like the deltas)."""
        tensors = _float_tensors(delta, f"delta of {participant_id!r}")
        previous = self._sums.get(participant_id)
        if previous is None:
            self._sums[participant_id] = (tensors, float(weight))
            return
        total, total_weight = previous
        _check_like(total, tensors, f"delta of {participant_id!r}")
        # A sum beyond float32 becomes inf here and is refused by the reduction.
        with np.errstate(over="ignore", invalid="ignore"):
            summed = [a + b for a, b in zip(total, tensors, strict=True)]
        self._sums[participant_id] = (summed, total_weight + float(weight))

    def copy(self) -> ParticipantSums:
        """An independent copy: add() replaces a participant's arrays, never writes into them."""
        twin = ParticipantSums(self._reduce)
        twin._sums = dict(self._sums)
        return twin

    def result(self) -> list[np.ndarray]:
        """The reduction of the participants' sums, weighted by their summed weights."""
        sums = list(self._sums.values())
        return self._reduce([d for d, _ in sums], [w for _, w in sums])


def apply_update(
    global_tensors: Sequence[np.ndarray], aggregate: Sequence[np.ndarray], *, server_lr: float
) -> list[np.ndarray]:
    """new = global + server_lr * aggregate, as float32; refuses a result that overflows."""
    if not math.isfinite(server_lr) or server_lr <= 0:
        raise ValueError(f"server_lr must be finite and positive, got {server_lr}")
    base = _float_tensors(global_tensors, "global model")
    step = _float_tensors(aggregate, "aggregate")
    _check_like(base, step, "aggregate")
    result: list[np.ndarray] = []
    for index, (g, a) in enumerate(zip(base, step, strict=True)):
        # In float64, one buffer, no temporaries; a non-finite input makes a
        # non-finite result, so the inputs are only looked at when it is one.
        wide = a.astype(np.float64)
        wide *= server_lr
        wide += g
        with np.errstate(over="ignore"):
            new = wide.astype(np.float32)
        if not np.isfinite(new).all():
            _check_finite(g, f"global model tensor {index}")
            _check_finite(a, f"aggregate tensor {index}")
            raise ValueError(
                f"applying the aggregate overflows float32 in tensor {index}; "
                "lower server_lr or clip update norms"
            )
        result.append(new)
    return result


def server_step(
    global_tensors: Sequence[np.ndarray],
    aggregate: Sequence[np.ndarray],
    *,
    learning_rate: float,
    momentum: float = 0.0,
    velocity: Sequence[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """(new global, velocity to carry): FedAvgM's step, FedAvg's when momentum is 0.

    velocity = momentum * velocity + aggregate, summed in float64 and kept as
    float32 (the form a restart reads back, so a restart continues exactly);
    new = global + learning_rate * velocity. With momentum 0 no velocity is
    carried (None) and new = global + learning_rate * aggregate, bit for bit.
    None as the incoming velocity is a velocity of zeros.
    """
    if not (math.isfinite(momentum) and 0 <= momentum < 1):
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    if momentum == 0:
        return apply_update(global_tensors, aggregate, server_lr=learning_rate), None
    step = _float_tensors(aggregate, "aggregate")
    if velocity is not None:
        previous = _float_tensors(velocity, "velocity")
        _check_like(step, previous, "velocity")
        with np.errstate(over="ignore"):
            step = [
                (p.astype(np.float64) * momentum + a).astype(np.float32)
                for p, a in zip(previous, step, strict=True)
            ]
        for index, tensor in enumerate(step):
            _check_finite(tensor, f"velocity tensor {index}")
    return apply_update(global_tensors, step, server_lr=learning_rate), step


def _weighted_sum(flats: Sequence[np.ndarray], weights: Float64Array) -> np.ndarray:
    """sum_k weights[k] * flats[k] as float32, summed in float64 one cache-sized block at a time.

    Not `weights @ stacked`: a BLAS call may start a thread per core, and on
    a server whose cores are busy with requests those threads made the mean
    5x slower.
    """
    size = flats[0].size
    out = np.empty(size, dtype=np.float32)
    total = np.empty(min(size, _BLOCK), dtype=np.float64)
    term = np.empty_like(total)
    for start in range(0, size, _BLOCK):
        stop = min(start + _BLOCK, size)
        block, scratch = total[: stop - start], term[: stop - start]
        np.multiply(flats[0][start:stop], weights[0], out=block, dtype=np.float64)
        for flat, weight in zip(flats[1:], weights[1:], strict=True):
            np.multiply(flat[start:stop], weight, out=scratch, dtype=np.float64)
            np.add(block, scratch, out=block)
        with np.errstate(over="ignore", invalid="ignore"):
            out[start:stop] = block
    return out


def _blockwise(
    models: list[list[np.ndarray]], kernel: Callable[[Float64Array], Float64Array]
) -> list[np.ndarray]:
    """Apply `kernel` to (K, B) float64 blocks of each tensor's coordinates."""
    count = len(models)
    result: list[np.ndarray] = []
    for index, first in enumerate(models[0]):
        flats = [model[index].reshape(-1) for model in models]
        size = first.size
        out = np.empty(size, dtype=np.float32)
        scratch = np.empty((count, min(size, _BLOCK)), dtype=np.float64)
        for start in range(0, size, _BLOCK):
            stop = min(start + _BLOCK, size)
            block = scratch[:, : stop - start]
            for row, flat in enumerate(flats):
                block[row] = flat[start:stop]
            if not np.isfinite(block).all():
                bad = next(r for r in range(count) if not np.isfinite(block[r]).all())
                raise ValueError(f"delta {bad}, tensor {index}: holds NaN or infinity")
            out[start:stop] = kernel(block)
        result.append(out.reshape(first.shape))
    return result


def _validated(
    deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
) -> tuple[list[list[np.ndarray]], Float64Array]:
    """Check counts, dtypes, shapes and weights; finiteness is checked block by block."""
    if len(deltas) == 0:
        raise ValueError("no deltas to aggregate")
    if len(weights) != len(deltas):
        raise ValueError(f"{len(deltas)} deltas but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"weights must be a flat sequence of numbers, got shape {w.shape}")
    for index, weight in enumerate(w):
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight {index} must be finite and positive, got {weight}")
    models = [_float_tensors(delta, f"delta {i}") for i, delta in enumerate(deltas)]
    for i, model in enumerate(models[1:], start=1):
        _check_like(models[0], model, f"delta {i}")
    return models, w


def _float_tensors(tensors: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    """The tensors as float32 (no copy when they are), refusing non-floating input.

    Working in float32 from the start keeps every square and product finite in
    the float64 sums below.
    """
    result = []
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, np.ndarray):
            raise TypeError(f"{what}, tensor {index}: expected numpy.ndarray, got {type(tensor)}")
        if tensor.dtype.kind != "f":
            raise ValueError(
                f"{what}, tensor {index}: dtype {tensor.dtype} is not floating; "
                "aggregation works on float tensors"
            )
        with np.errstate(over="ignore"):
            narrow = tensor.astype(np.float32, copy=False)
        if narrow is not tensor and np.isfinite(tensor).all() and not np.isfinite(narrow).all():
            raise ValueError(f"{what}, tensor {index}: values beyond float32's range")
        result.append(narrow)
    return result


def _check_like(reference: list[np.ndarray], tensors: list[np.ndarray], what: str) -> None:
    """Same number of tensors and the same shapes as the reference model."""
    if len(tensors) != len(reference):
        raise ValueError(f"{what} has {len(tensors)} tensors, expected {len(reference)}")
    for index, (ref, got) in enumerate(zip(reference, tensors, strict=True)):
        if got.shape != ref.shape:
            raise ValueError(
                f"{what}, tensor {index}: shape {got.shape} differs from expected {ref.shape}"
            )


def _check_finite(tensor: np.ndarray, what: str) -> None:
    if not np.isfinite(tensor).all():
        raise ValueError(f"{what} holds NaN or infinity")


def _squared_norm(tensor: np.ndarray) -> float:
    """Sum of squares accumulated in float64, without a float64 copy of the tensor."""
    flat = tensor.reshape(-1)
    return float(np.einsum("i,i->", flat, flat, dtype=np.float64))


def _integer(value: int, what: str) -> int:
    """An int or numpy integer; bool and float are refused rather than truncated."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None


def _non_negative_int(value: int, what: str) -> int:
    """An integer that is >= 0."""
    number = _integer(value, what)
    if number < 0:
        raise ValueError(f"{what} must be >= 0, got {number}")
    return number
