"""Videos from RGB frames: MP4 (H.264) through PyAV, GIF where MP4 cannot be written.

PyAV links FFmpeg in-process and its wheels carry the encoders, so MP4 needs
no ffmpeg binary on the machine. Frames are encoded as they come, so a long
game never sits in memory. A GIF is written where the file asks for one
(`.gif`), and in place of an MP4 when PyAV has no H.264 encoder or is
missing: by PyAV's GIF encoder, or without PyAV by Pillow, which holds the
frames until the end (the `video` extra installs both).
Frames are scaled up by a whole factor to at least `min_height` pixels (an
Atari screen is 210 high) and the score is drawn in a band above each one.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fedrl.common.closing import Closing

VIDEO_INSTALL_HINT = "videos need PyAV or Pillow: pip install 'fedrl[video]'"
H264_ENCODERS = ("libx264", "h264", "libopenh264")
BAND = 24
"""Pixels of the band the score is drawn in."""


class VideoError(ValueError):
    """The video cannot be written here; the message says what to install."""


def pyav_encoder(names: tuple[str, ...]) -> str | None:
    """The first of the encoders `names` that PyAV has here, if PyAV is installed."""
    if importlib.util.find_spec("av") is None:
        return None
    available = importlib.import_module("av").codecs_available
    return next((name for name in names if name in available), None)


def scale(frame: npt.NDArray[np.uint8], min_height: int) -> npt.NDArray[np.uint8]:
    """The frame scaled up by the smallest whole factor that makes it `min_height` high."""
    factor = max(1, -(-min_height // frame.shape[0]))
    if factor == 1:
        return frame
    return np.repeat(np.repeat(frame, factor, axis=0), factor, axis=1)


def with_caption(frame: npt.NDArray[np.uint8], text: str) -> npt.NDArray[np.uint8]:
    """The frame below a black band holding `text` in white."""
    image_module = importlib.import_module("PIL.Image")
    draw_module = importlib.import_module("PIL.ImageDraw")
    font_module = importlib.import_module("PIL.ImageFont")
    height, width = frame.shape[:2]
    canvas = np.zeros((height + BAND, width, 3), dtype=np.uint8)
    canvas[BAND:] = frame[..., :3]
    image = image_module.fromarray(canvas)
    font = font_module.load_default(size=BAND - 8)
    draw_module.Draw(image).text((6, 3), text, fill=(255, 255, 255), font=font)
    return np.asarray(image)


class VideoWriter(Closing):
    """Writes RGB frames of one size to `path`: MP4, or GIF (see the module's notes).

    `path` says what was asked for; `written` where the video went (a GIF
    beside an .mp4 that could not be encoded), known once the first frame came.
    """

    def __init__(self, path: Path, *, fps: int) -> None:
        if path.suffix.lower() not in (".mp4", ".gif"):
            raise VideoError(f"{path}: write a .mp4 or a .gif")
        if fps < 1:
            raise VideoError(f"fps must be at least 1, got {fps}")
        self.path = path
        self.fps = fps
        self.frames = 0
        encoder = pyav_encoder(H264_ENCODERS) if path.suffix.lower() == ".mp4" else None
        self.written = path if encoder is not None else path.with_suffix(".gif")
        if encoder is None:
            encoder = pyav_encoder(("gif",))
        # (encoder, pixel format) for PyAV; None: Pillow writes a GIF.
        self._codec = (
            None if encoder is None else (encoder, "rgb8" if encoder == "gif" else "yuv420p")
        )
        if self._codec is None and importlib.util.find_spec("PIL") is None:
            raise VideoError(VIDEO_INSTALL_HINT)
        self._container: Any = None
        self._stream: Any = None
        self._gif: list[Any] = []

    def add(self, frame: npt.NDArray[np.uint8]) -> None:
        if self._codec is not None:
            self._encode(frame, *self._codec)
        else:
            image_module = importlib.import_module("PIL.Image")
            self._gif.append(image_module.fromarray(frame[..., :3]).quantize(colors=256))
        self.frames += 1

    def _encode(self, frame: npt.NDArray[np.uint8], encoder: str, pix_fmt: str) -> None:
        av = importlib.import_module("av")
        if self._container is None:
            # yuv420p halves the chroma planes: the picture's sides must be even.
            height, width = frame.shape[0] + frame.shape[0] % 2, frame.shape[1] + frame.shape[1] % 2
            self._container = av.open(str(self.written), mode="w")
            self._stream = self._container.add_stream(encoder, rate=self.fps)
            self._stream.width, self._stream.height = width, height
            self._stream.pix_fmt = pix_fmt
        padded = np.zeros((self._stream.height, self._stream.width, 3), dtype=np.uint8)
        padded[: frame.shape[0], : frame.shape[1]] = frame[..., :3]
        video_frame = av.VideoFrame.from_ndarray(padded, format="rgb24")
        for packet in self._stream.encode(video_frame):
            self._container.mux(packet)

    def close(self) -> None:
        if self._container is not None:
            for packet in self._stream.encode():
                self._container.mux(packet)
            self._container.close()
            self._container = None
        if self._gif:
            first, *rest = self._gif
            first.save(
                self.written,
                save_all=True,
                append_images=rest,
                duration=max(20, round(1000 / self.fps)),
                loop=0,
            )
            self._gif = []


def count_frames(path: Path) -> int:
    """Frames in a video file, decoded (PyAV for MP4, Pillow for GIF)."""
    if path.suffix.lower() == ".gif":
        image = importlib.import_module("PIL.Image").open(path)
        return int(getattr(image, "n_frames", 1))
    av = importlib.import_module("av")
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def write_frames(path: Path, frames: Iterable[npt.NDArray[np.uint8]], *, fps: int) -> Path:
    """All of `frames` into a video at `path`; returns where it went."""
    with VideoWriter(path, fps=fps) as writer:
        for frame in frames:
            writer.add(frame)
    return writer.written
