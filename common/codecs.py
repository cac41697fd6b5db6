"""Byte codecs for tensors on the wire: none and zstd, with bounded decoding.

Decoding is where hostile input bites: a few kilobytes of zstd can claim to
expand to gigabytes. Every decode here is told the exact size it must produce
and never holds more than that (plus one byte to notice an overrun).
"""

from __future__ import annotations

import io
import threading

import zstandard

from fedrl.common.errors import DecodeError
from fedrl.proto.v1 import tensor_pb2 as pb

# Level 3 is zstd's default: ~1 GB/s here on float tensors and transitions;
# higher levels buy a few percent of size for several times the CPU.
ZSTD_LEVEL = 3

# zstd's window is capped so a hostile frame cannot make the decoder reserve
# a huge history buffer: 2**27 bytes is zstd's own default limit.
_MAX_WINDOW = 1 << 27

# A ZstdCompressor holds one native context and is not thread-safe (sharing
# one between threads crashed the process), so each thread gets its own.
_LOCAL = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    compressor: zstandard.ZstdCompressor | None = getattr(_LOCAL, "compressor", None)
    if compressor is None:
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        _LOCAL.compressor = compressor
    return compressor


CODECS = {pb.CODEC_NONE: "none", pb.CODEC_ZSTD: "zstd"}


def encoded_size_bound(codec: int, raw_size: int) -> int:
    """Largest encoded size a well-formed payload of raw_size bytes can have."""
    if codec == pb.CODEC_NONE:
        return raw_size
    # zstd's worst case on incompressible input: ZSTD_compressBound is
    # raw + raw/256 + a small constant; the slack covers the frame header.
    return raw_size + raw_size // 128 + 1024


def encode_bytes(codec: int, raw: bytes | memoryview) -> bytes:
    """Encode raw bytes with codec."""
    if codec == pb.CODEC_NONE:
        return bytes(raw)
    if codec == pb.CODEC_ZSTD:
        return _compressor().compress(raw)
    raise ValueError(f"unknown codec {codec}; use one of {sorted(CODECS.values())}")


def decode_bytes(codec: int, data: bytes | bytearray | memoryview, raw_size: int) -> bytes:
    """Decode data that must expand to exactly raw_size bytes, never more."""
    if codec == pb.CODEC_NONE:
        if len(data) != raw_size:
            raise DecodeError(f"uncompressed payload has {len(data)} bytes, header says {raw_size}")
        return bytes(data)
    if codec != pb.CODEC_ZSTD:
        raise DecodeError(f"unknown codec {codec}")
    try:
        declared = zstandard.frame_content_size(bytes(data[:18]))
    except zstandard.ZstdError as exc:
        raise DecodeError(f"not a zstd frame: {exc}") from exc
    if declared not in (-1, raw_size):
        raise DecodeError(f"zstd frame declares {declared} bytes, header says {raw_size}")
    decompressor = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    try:
        with decompressor.stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
            out = reader.read(raw_size + 1) if raw_size else reader.read(1)
            if len(out) == raw_size and raw_size:
                # A truncated frame fails here rather than on the read above.
                out += reader.read(1)
    except zstandard.ZstdError as exc:
        if "Destination buffer is too small" in str(exc):
            # zstd's words for a frame whose blocks hold more than it declared.
            raise DecodeError(
                f"zstd payload expands to more bytes than the {raw_size} its header and "
                "frame declare"
            ) from exc
        raise DecodeError(f"corrupt zstd payload (not {raw_size} valid bytes): {exc}") from exc
    if len(out) != raw_size:
        what = "more" if len(out) > raw_size else f"only {len(out)} (truncated?)"
        raise DecodeError(f"zstd payload expands to {what} bytes, header says {raw_size}")
    return out
