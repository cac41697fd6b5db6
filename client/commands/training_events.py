"""A participant's metrics records as TensorBoard scalars, beside metrics.jsonl.

Every numeric field of a record becomes the scalar `<kind>/<field>`
(`episode/return`, `train/loss`, `eval/mean`, `sync/version`,
`score/global_eval`, ...), so whatever metrics.jsonl holds TensorBoard shows,
and a field added there appears here without a change. The step is the
record's env_steps, so `tensorboard --logdir fedrl-state` lays a group's
participants side by side on one x axis. Three more figures the progress line
shows are derived here: `speed/env_steps_per_s` and `speed/updates_per_s`
(over at least RATE_WINDOW_S between train records, so one slow poll does not
draw a spike) and `explore/epsilon`, the mean exploration rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedrl.common.event_files import ScalarEvents
from fedrl.common.identity import safe_dirname

OFF = "off"
"""The --tensorboard value that turns event files off."""
AXES = frozenset({"kind", "time", "episode", "env_steps"})
"""Record fields that place a scalar (its step and wall time) rather than being one."""
RATE_WINDOW_S = 5.0
"""Shortest span a speed figure is measured over, as the progress line does (~10 s)."""


def tensorboard_dir(option: str, state_root: Path, participant_id: str) -> Path | None:
    """Where a participant's event files go: `<option or state_root>/<participant id>/`.

    By default that is the participant's own state dir, so one `--logdir` over
    the state root shows every participant as a run named after it; None when
    the option is "off".
    """
    if option == OFF:
        return None
    return Path(option or state_root) / safe_dirname(participant_id)


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric fields as TensorBoard tags `<kind>/<field>`."""
    kind = str(record["kind"])
    return {
        f"{kind}/{name}": value
        for name, value in record.items()
        if name not in AXES and isinstance(value, int | float) and not isinstance(value, bool)
    }


class TrainingEvents:
    """Writes metrics records to one participant's event file, with the derived figures."""

    def __init__(self, logdir: Path, *, epsilon: float | None = None) -> None:
        self._events = ScalarEvents(logdir)
        self._epsilon = epsilon
        self._rate_from: tuple[float, int, int] | None = None
        """(time, env_steps, updates) of the train record the next speed is measured from."""

    @property
    def logdir(self) -> Path:
        return self._events.logdir

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        for record in records:
            scalars = scalars_of(record)
            if record["kind"] == "train":
                scalars.update(self._speeds(record))
            self._events.add(scalars, step=int(record["env_steps"]), wall_time=record["time"])
        self._events.flush()

    def close(self) -> None:
        self._events.close()

    def _speeds(self, record: dict[str, Any]) -> dict[str, float]:
        now = (float(record["time"]), int(record["env_steps"]), int(record["updates"]))
        if self._rate_from is None:
            self._rate_from = now
            return {}
        then = self._rate_from
        span = now[0] - then[0]
        if span < RATE_WINDOW_S:
            return {}
        self._rate_from = now
        speeds = {
            "speed/env_steps_per_s": (now[1] - then[1]) / span,
            "speed/updates_per_s": (now[2] - then[2]) / span,
        }
        if self._epsilon is not None:
            speeds["explore/epsilon"] = self._epsilon
        return speeds
