"""TensorBoard event files of scalars, for participants and the server alike.

Written with TensorBoard's own EventFileWriter (the writer torch's
SummaryWriter wraps, and which needs no torch): it frames each Event as a
TFRecord with masked CRC32C checksums and names the file the way
`tensorboard --logdir` discovers it, so every directory holding one shows as
a run. The server may use it too: nothing here imports torch.

Writers call `flush` after each batch of `add`s, as metrics.jsonl is flushed
after each batch of lines: a kill loses at most the batch being written, and
a running TensorBoard shows it at its next reload. (Flushing after every
event would cost a hand-over to the writer's thread per episode.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class ScalarEvents:
    """One event file of scalars in `logdir`, created on the first `add`.

    A run that adds nothing leaves no file behind (TensorBoard would list it
    as an empty run).
    """

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self._writer: EventFileWriter | None = None

    def add(self, scalars: Mapping[str, float], *, step: int, wall_time: float) -> None:
        """Scalars at one step; values that are not finite numbers are left out.

        TensorBoard would draw NaN or infinity as a gap or a spike that hides
        the rest of the curve; metrics.jsonl leaves them out for the same reason.
        """
        values = [
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in scalars.items()
            if _is_finite_number(value)
        ]
        if not values:
            return
        if self._writer is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.logdir))
        event = event_pb2.Event(
            wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values)
        )
        self._writer.add_event(event)

    def flush(self) -> None:
        """Everything added so far on disk (in the page cache: not fsynced, like metrics.jsonl)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _is_finite_number(value: object) -> bool:
    # bool is an int to Python, but a flag is no curve.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
