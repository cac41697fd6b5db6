"""The live progress line of long-running commands: a tqdm bar on a terminal, log lines elsewhere.

`ProgressReporter.update(**fields)` takes the documented fields below and
renders them; `TrainingProgress` computes those fields from the engine's
counters after every poll. On a terminal the bar redraws in place; when
stderr is not a terminal (CI, a file, `nohup`) a redrawn bar would write
thousands of carriage returns into the log, so the reporter writes one plain
`key=value` line every `interval_s` seconds instead, which `grep` and
`awk` can read.
"""

from __future__ import annotations

import collections
import io
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm

from fedrl.client.commands.gpu_stats import GpuMonitor
from fedrl.client.training.counters import Counters, PollResult
from fedrl.client.training.evaluation import MatchRecord
from fedrl.client.training.exploration import apex_epsilons
from fedrl.common.closing import Closing

if TYPE_CHECKING:
    from fedrl.client.federation.server_link import ServerView

FieldValue = int | float | str | None


@dataclass(frozen=True)
class ProgressField:
    """One documented progress field: its name in log lines, its label on the bar, its meaning."""

    name: str
    """Name in plain log lines (`name=value`) and the keyword of `update`."""
    label: str
    """Short label on the terminal bar."""
    doc: str
    """What it means, for the table in docs/monitoring.md."""
    digits: int
    """Decimals shown; 0 for counts."""
    on_bar: bool = True
    """Shown on the terminal bar too; False for what tqdm's own counters already show."""


PROGRESS_FIELDS: tuple[ProgressField, ...] = (
    ProgressField("episodes", "ep", "Episodes done by this participant, resumed ones included.", 0),
    ProgressField("target", "of", "Episodes at which this run stops.", 0),
    ProgressField("env_steps_per_s", "steps/s", "Env steps per second, last ~10 s.", 0),
    ProgressField("updates_per_s", "upd/s", "Learner updates per second, last ~10 s.", 0),
    ProgressField(
        "epsilon", "ε", "DQN: mean exploration rate over all envs (share of random actions).", 3
    ),
    ProgressField("mean_return", "return", "Mean return of the last 100 local episodes.", 1),
    ProgressField("best_eval", "best", "Best greedy evaluation return so far.", 1),
    ProgressField("replay_size", "replay", "DQN: transitions in the replay buffer.", 0),
    ProgressField(
        "rating", "elo", "Two-player games: the learner's Elo (the random player is 0).", 0
    ),
    ProgressField(
        "games",
        "games",
        "Two-player games, last evaluation: win/draw/loss percent against each fixed player, "
        "both seats together, e.g. random:98/1/1,lookahead:61/12/27.",
        0,
    ),
    ProgressField(
        "loss", "loss", "Mean loss of the latest training round (DQN: TD; PPO: all terms).", 4
    ),
    ProgressField("version", "v", "Federated: newest global model version on the server.", 0),
    ProgressField("participants", "peers", "Federated: active participants in the session.", 0),
    ProgressField(
        "sync",
        "sync",
        "Federated: how this participant syncs now: warmup (DQN sharing both: rounds until "
        "its learner starts), rounds (--round-wait-s) or async.",
        0,
    ),
    ProgressField(
        "session_episodes", "session", "Federated: episodes done by the whole session.", 0
    ),
    ProgressField("session_goal", "goal", "Federated: the session's total-episodes goal.", 0),
    ProgressField(
        "generation", "gen", "Population (--mode pbt): exploits this member has made so far.", 0
    ),
    ProgressField(
        "gpus",
        "gpu",
        "Per GPU, from NVIDIA's management library: index:utilisation%/used of total "
        "GiB/temperature, e.g. 0:87%/3.1of80GiB/61C. Absent without GPUs, which the run "
        "says once at its start.",
        0,
    ),
)
FIELDS_BY_NAME: Mapping[str, ProgressField] = {f.name: f for f in PROGRESS_FIELDS}


def _plain(value: str) -> str:
    """A value as one `key=value` token: quoted where it holds a space."""
    return f'"{value}"' if " " in value else value


def format_value(field: ProgressField, value: FieldValue) -> str:
    """A field's value as shown: "-" while unknown, thousands as "12.3k" only on the bar."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, str):
        return value
    if field.digits == 0:
        return str(round(value))
    return f"{value:.{field.digits}f}"


def _compact(value: FieldValue, field: ProgressField) -> str:
    # The bar shares one terminal line with tqdm's own counters, so large
    # counts are abbreviated there; log lines keep the exact numbers.
    if isinstance(value, int | float) and field.digits == 0 and abs(value) >= 10_000:
        return f"{value / 1000:.1f}k" if abs(value) < 10_000_000 else f"{value / 1e6:.1f}M"
    return format_value(field, value)


class ProgressReporter(Closing):
    """Shows the documented progress fields: a tqdm bar on a terminal, periodic lines otherwise.

    `update` may be called every poll (tens of times a second): the bar is
    redrawn at most every `redraw_s`, the plain line written at most every
    `interval_s` (or at once with `force=True`, e.g. after an evaluation).
    The bar counts the field named `count` toward the one named `total`
    (training: episodes toward the target); other commands pass fields of
    their own.
    """

    def __init__(
        self,
        *,
        description: str = "train",
        fields: Sequence[ProgressField] = PROGRESS_FIELDS,
        count: str = "episodes",
        total: str = "target",
        unit: str = "ep",
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float = 5.0,
        redraw_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"progress interval must be > 0 seconds, got {interval_s}")
        self._fields = tuple(fields)
        self._by_name = {f.name: f for f in self._fields}
        if count not in self._by_name or total not in self._by_name:
            raise ValueError(f"progress fields must include {count!r} and {total!r}")
        self._count, self._total, self._unit = count, total, unit
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._description = description
        self._interval_s = interval_s
        self._redraw_s = redraw_s
        self._clock = clock
        self._values: dict[str, FieldValue] = {}
        self._last_emit: float | None = None
        self._unshown = False
        """Values were set since the last time they were shown."""
        self._bar: tqdm | None = None
        self._closed = False

    @property
    def values(self) -> Mapping[str, FieldValue]:
        """The latest value of every field set so far."""
        return dict(self._values)

    def update(self, *, force: bool = False, **fields: FieldValue) -> None:
        """Record new field values; redraw or log if it is time. Unknown names are an error."""
        unknown = sorted(set(fields) - set(self._by_name))
        if unknown:
            raise ValueError(
                f"unknown progress field(s) {unknown}; documented: {sorted(self._by_name)}"
            )
        if self._closed:
            raise RuntimeError("progress reporter already closed")
        self._values.update(fields)
        self._unshown = True
        now = self._clock()
        wait = self._redraw_s if self._tty else self._interval_s
        if force or self._last_emit is None or now - self._last_emit >= wait:
            self._last_emit = now
            self._emit()

    def write(self, message: str) -> None:
        """A message of its own line that does not tear the bar apart."""
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def plain_line(self) -> str:
        """The fields set so far as one `progress key=value ...` line, in documented order."""
        parts = [self._description]
        total = self._values.get(self._total)
        for field in self._fields:
            if field.name == self._total or field.name not in self._values:
                continue
            text = format_value(field, self._values[field.name])
            if field.name == self._count and total is not None:
                text += "/" + format_value(self._by_name[self._total], total)
            parts.append(f"{field.name}={_plain(text)}")
        return " ".join(parts)

    def close(self) -> None:
        """Shows the final values if they are not shown yet (so a log ends with them) and
        releases the bar."""
        if self._closed:
            return
        if self._unshown:
            self._emit()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._closed = True

    def _emit(self) -> None:
        self._unshown = False
        if not self._tty:
            print(self.plain_line(), file=self._stream, flush=True)
            return
        target = self._values.get(self._total)
        episodes = self._values.get(self._count) or 0
        if self._bar is None:
            # A terminal that reports no size (a pty under `script`, some CI
            # runners) makes tqdm hide the bar entirely; assume 120x24 there.
            sized = _terminal_sized(self._stream)
            self._bar = tqdm(
                total=None if target is None else int(target),
                # Resumed episodes are not this run's speed.
                initial=int(episodes),
                desc=self._description,
                unit=self._unit,
                file=self._stream,
                dynamic_ncols=sized,
                ncols=None if sized else 120,
                nrows=None if sized else 24,
                # Redraws are throttled here; tqdm must draw whenever asked.
                mininterval=0,
                leave=True,
            )
        if target is not None and self._bar.total != int(target):
            self._bar.total = int(target)
        self._bar.n = int(episodes)
        postfix = "  ".join(
            f"{f.label} {_compact(self._values[f.name], f)}".strip()
            for f in self._fields
            if f.on_bar and f.name not in (self._count, self._total) and f.name in self._values
        )
        self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.refresh()


def _terminal_sized(stream: TextIO) -> bool:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    return size.columns > 0 and size.lines > 0


class RateMeter:
    """Events per second over a sliding window: recent speed, not the average since start.

    A run that resumes, or slows down when another process takes the cores,
    shows its present speed within `window_s` seconds.
    """

    def __init__(self, *, window_s: float = 10.0) -> None:
        self._window_s = window_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, now: float, total: float) -> float | None:
        """Records a running total at `now`; the rate, or None until the samples span time."""
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window_s:
            self._samples.popleft()
        first_time, first_total = self._samples[0]
        if now <= first_time:
            return None
        return (total - first_total) / (now - first_time)


def games_text(matches: Sequence[MatchRecord]) -> str:
    """Win/draw/loss percent against each opponent, both seats together:
    "random:98/1/1,lookahead:61/12/27"."""
    totals: dict[str, list[int]] = {}
    for match in matches:
        counts = totals.setdefault(match.opponent, [0, 0, 0])
        for i, count in enumerate((match.wins, match.draws, match.losses)):
            counts[i] += count
    parts = []
    for opponent, counts in totals.items():
        games = max(1, sum(counts))
        parts.append(f"{opponent}:" + "/".join(str(round(100 * c / games)) for c in counts))
    return ",".join(parts)


def mean_epsilon(num_envs: int, *, base: float, alpha: float) -> float:
    """The share of random actions over all actors' envs on the Ape-X schedule."""
    return float(apex_epsilons(max(1, num_envs), base=base, alpha=alpha).mean())


class TrainingProgress:
    """Feeds a reporter the progress fields of a training run, one call per engine poll."""

    def __init__(
        self,
        reporter: ProgressReporter,
        *,
        target: int,
        epsilon: float | None,
        replay_size: Callable[[], int | None],
        gpus: GpuMonitor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reporter = reporter
        self._gpus = gpus
        self._target = target
        self._epsilon = epsilon
        self._replay_size = replay_size
        self._clock = clock
        self._steps = RateMeter()
        self._updates = RateMeter()
        self._loss: float | None = None
        self._games: str | None = None

    def __call__(
        self,
        counters: Counters,
        result: PollResult,
        view: ServerView | None = None,
        *,
        sync_mode: str | None = None,
        generation: int | None = None,
    ) -> None:
        now = self._clock()
        if "loss" in result.train_metrics:
            self._loss = result.train_metrics["loss"]
        if result.evaluation is not None and result.evaluation.matches:
            self._games = games_text(result.evaluation.matches)
        recent = counters.recent_returns
        fields: dict[str, Any] = {
            "episodes": counters.episodes,
            "target": self._target,
            "env_steps_per_s": self._steps.add(now, counters.env_steps),
            "updates_per_s": self._updates.add(now, counters.updates),
            "epsilon": self._epsilon,
            "mean_return": sum(recent) / len(recent) if recent else None,
            "best_eval": counters.best_eval,
            "replay_size": self._replay_size(),
            "loss": self._loss,
        }
        if generation is not None:
            fields["generation"] = generation
        if result.rating is not None:
            fields["rating"] = result.rating
            fields["games"] = self._games
        if self._gpus is not None and self._gpus.found:
            fields["gpus"] = self._gpus.brief()
        if view is not None:
            fields["version"] = view.version if view.version >= 0 else None
            fields["participants"] = view.active_participants
            fields["sync"] = sync_mode
            if view.goal is not None:
                fields["session_episodes"] = view.goal.episodes_done
                fields["session_goal"] = view.goal.total_episodes
        self._reporter.update(force=result.evaluation is not None, **fields)
