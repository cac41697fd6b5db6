"""A participant's state directory: latest and best model, progress, metrics; autosave and resume.

Layout of `<root>/<participant id>/`:
  model.pt       latest weights and the counters they belong to (every few episodes)
  best.pt        weights of the best greedy evaluation so far
  progress.pt    counters plus the learner's full state: networks, optimizer, schedules
  metrics.jsonl  one JSON object per episode and per evaluation, appended
  config.toml    the configuration of the latest run, as a config file: `fedrl-client config`
                 prints it, `fedrl-client --config` runs it again
  events.out.tfevents.*  the same records as TensorBoard scalars (unless --tensorboard
                 sends them elsewhere or off; see training_events)

Every .pt file is written to a temporary name, fsynced and renamed, so a kill
at any moment leaves the previous complete file, and is read with
`torch.load(weights_only=True)`, which refuses anything but tensors, numbers,
strings and containers: a state dir copied from elsewhere cannot run code.
The replay buffer is not saved (for CartPole it refills in a second; for
images it would be gigabytes), so a resumed run waits for `learning_starts`
fresh transitions before it trains again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.commands.training_events import TrainingEvents
from fedrl.client.training.counters import Counters, PollResult
from fedrl.client.training.engine import TrainingEngine
from fedrl.common.durable_files import write_atomically
from fedrl.common.identity import safe_dirname, validate_participant_id

FORMAT = 1
MODEL_FILE, BEST_FILE, PROGRESS_FILE, METRICS_FILE, CONFIG_FILE = (
    "model.pt",
    "best.pt",
    "progress.pt",
    "metrics.jsonl",
    "config.toml",
)
PARTICIPANT_ID_FILE = "participant-id"
"""Under the state dirs' root: the id generated for a participant who gave none, reused next
time."""

NamedArrays = list[tuple[str, npt.NDArray[Any]]]


class StateError(ValueError):
    """A state file that cannot be resumed from, with what to do about it."""


@dataclass(frozen=True)
class ModelIdentity:
    """What a saved model must match to be resumed into this run."""

    env: str
    architecture: str


@dataclass(frozen=True)
class Resumed:
    """What a state dir holds, newest first: counters, the learner's state, newer weights."""

    counters: Counters
    learner_state: dict[str, Any] | None
    weights: NamedArrays | None


class StateDir:
    """One participant's files under `root`; created on first use."""

    def __init__(
        self,
        root: Path,
        participant_id: str,
        identity: ModelIdentity,
        *,
        events: TrainingEvents | None = None,
    ) -> None:
        self.participant_id = validate_participant_id(participant_id)
        self.path = Path(root) / safe_dirname(self.participant_id)
        self.identity = identity
        self._metrics: TextIO | None = None
        self._events = events
        """Where every metrics record also goes as TensorBoard scalars; None for nowhere."""

    # -- saving --------------------------------------------------------------

    def save_model(self, weights: NamedArrays, counters: Counters) -> None:
        self._write(MODEL_FILE, self._model_payload(weights, counters))

    def save_best(self, weights: NamedArrays, counters: Counters, eval_return: float) -> None:
        payload = self._model_payload(weights, counters)
        payload["eval_return"] = float(eval_return)
        self._write(BEST_FILE, payload)

    def save_progress(self, counters: Counters, learner_state: dict[str, Any]) -> None:
        self._write(
            PROGRESS_FILE,
            {
                "format": FORMAT,
                "participant_id": self.participant_id,
                **self._identity_dict(),
                "counters": dataclasses.asdict(counters),
                "learner": learner_state,
            },
        )

    def save_config(self, text: str) -> None:
        """The run's configuration as a config file (written whole or not at all)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path / CONFIG_FILE, lambda file: file.write(text.encode("utf-8")))

    def append_metrics(self, records: Sequence[dict[str, Any]]) -> None:
        """Appends and flushes; a kill loses at most the line being written."""
        if not records:
            return
        if self._metrics is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self._metrics = (self.path / METRICS_FILE).open("a", encoding="utf-8")
        for record in records:
            self._metrics.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._metrics.flush()
        if self._events is not None:
            self._events.write(records)

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._events is not None:
            self._events.close()

    def _model_payload(self, weights: NamedArrays, counters: Counters) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "participant_id": self.participant_id,
            **self._identity_dict(),
            "counters": dataclasses.asdict(counters),
            "tensors": {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in weights},
        }

    def _identity_dict(self) -> dict[str, str]:
        return {"env": self.identity.env, "architecture": self.identity.architecture}

    def _write(self, name: str, payload: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path / name, lambda file: torch.save(payload, file))

    # -- loading -------------------------------------------------------------

    def load(self) -> Resumed | None:
        """What to resume from, or None for a fresh participant.

        progress.pt carries the learner's full state but is written less
        often; when model.pt is newer its weights and counters win, so a kill
        loses at most the episodes since the last model save.
        """
        progress = self._read(PROGRESS_FILE)
        model = self._read(MODEL_FILE)
        if progress is None and model is None:
            return None
        progress_counters = _counters(progress, PROGRESS_FILE) if progress else None
        model_counters = _counters(model, MODEL_FILE) if model else None
        learner_state = progress["learner"] if progress else None
        if learner_state is not None and not isinstance(learner_state, dict):
            raise StateError(f"{self.path / PROGRESS_FILE}: learner state is not a mapping")
        if model_counters is not None and (
            progress_counters is None or model_counters.episodes > progress_counters.episodes
        ):
            assert model is not None
            return Resumed(model_counters, learner_state, _tensors(model, self.path / MODEL_FILE))
        assert progress_counters is not None
        return Resumed(progress_counters, learner_state, None)

    def load_best(self) -> tuple[NamedArrays, float] | None:
        best = self._read(BEST_FILE)
        if best is None:
            return None
        return _tensors(best, self.path / BEST_FILE), float(best["eval_return"])

    def _read(self, name: str) -> dict[str, Any] | None:
        path = self.path / name
        if not path.exists():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StateError(
                f"{path} cannot be loaded ({exc}); it is damaged or not a fedrl state file. "
                "Move it away to start this participant afresh."
            ) from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise StateError(f"{path} is not a fedrl state file of format {FORMAT}")
        for key, want in self._identity_dict().items():
            if payload.get(key) != want:
                raise StateError(
                    f"{path} was saved for {key} {payload.get(key)!r}, this run uses {want!r}; "
                    "use another --participant-id or --state-dir to train a different model"
                )
        return payload


def _counters(payload: dict[str, Any], name: str) -> Counters:
    raw = payload.get("counters")
    if not isinstance(raw, dict):
        raise StateError(f"{name} has no counters")
    known = {f.name for f in dataclasses.fields(Counters)}
    try:
        values = {k: v for k, v in raw.items() if k in known}
        values["recent_returns"] = tuple(float(r) for r in values.get("recent_returns", ()))
        return Counters(**values)
    except (TypeError, ValueError) as exc:
        raise StateError(f"{name} has malformed counters: {exc}") from exc


def _tensors(payload: dict[str, Any], path: Path) -> NamedArrays:
    tensors = payload.get("tensors")
    if not isinstance(tensors, dict) or not all(
        isinstance(t, torch.Tensor) for t in tensors.values()
    ):
        raise StateError(f"{path} holds no named tensors")
    return [(str(name), t.numpy()) for name, t in tensors.items()]


class Autosaver:
    """Saves on the cadence users of the old tools expect and keeps metrics.jsonl growing.

    The latest model every `model_every` episodes and the full progress every
    `progress_every`, both counted on the participant's total episodes; the
    best model whenever an evaluation beats the best so far.
    """

    def __init__(
        self, state: StateDir, engine: TrainingEngine, *, model_every: int, progress_every: int
    ) -> None:
        if model_every < 1 or progress_every < 1:
            raise ValueError("save intervals must be at least one episode")
        self._state = state
        self._engine = engine
        self._model_every = model_every
        self._progress_every = progress_every
        self._train_metrics: dict[str, float] = {}
        episodes = engine.counters.episodes
        self._next_model = (episodes // model_every + 1) * model_every
        self._next_progress = (episodes // progress_every + 1) * progress_every

    def resume(self) -> Counters | None:
        """Restores the engine from the state dir; returns the counters resumed from, if any."""
        resumed = self._state.load()
        if resumed is None:
            return None
        if resumed.learner_state is not None:
            try:
                self._engine.learner.load_state_dict(resumed.learner_state)
            except ValueError as exc:
                raise StateError(f"{self._state.path / PROGRESS_FILE}: {exc}") from exc
        if resumed.weights is not None:
            try:
                self._engine.set_weights(resumed.weights)
            except ValueError as exc:
                raise StateError(f"{self._state.path / MODEL_FILE}: {exc}") from exc
        self._engine.restore_counters(resumed.counters)
        episodes = resumed.counters.episodes
        self._next_model = (episodes // self._model_every + 1) * self._model_every
        self._next_progress = (episodes // self._progress_every + 1) * self._progress_every
        return resumed.counters

    def __call__(self, result: PollResult) -> None:
        counters = self._engine.counters
        if result.train_metrics:
            # In parallel mode a round either trains or takes in episodes, never
            # both; the episode batch's line carries the latest training figures.
            self._train_metrics = result.train_metrics
        self._state.append_metrics(
            _metric_records(result, counters, self._train_metrics, self._engine.replay_size)
        )
        if result.new_best and result.evaluation is not None:
            self._state.save_best(self._engine.weights(), counters, result.evaluation.mean)
        if counters.episodes >= self._next_progress:
            self.save_all()
        elif counters.episodes >= self._next_model:
            self._state.save_model(self._engine.weights(), counters)
            self._next_model = (counters.episodes // self._model_every + 1) * self._model_every

    def save_all(self) -> None:
        """Latest model and full progress now (periodically, on Ctrl-C and at the end)."""
        counters = self._engine.counters
        self._state.save_model(self._engine.weights(), counters)
        self._state.save_progress(counters, self._engine.learner.state_dict())
        episodes = counters.episodes
        self._next_model = (episodes // self._model_every + 1) * self._model_every
        self._next_progress = (episodes // self._progress_every + 1) * self._progress_every


TRAIN_METRICS = (
    "loss",
    "q_mean",
    "td_abs_mean",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
)
"""Learner figures a "train" record carries where the algorithm has them (DQN, then PPO)."""


def _metric_records(
    result: PollResult,
    counters: Counters,
    train_metrics: dict[str, float],
    replay_size: int | None,
) -> list[dict[str, Any]]:
    now = round(time.time(), 3)
    first = counters.episodes - len(result.episode_returns) + 1
    records: list[dict[str, Any]] = [
        {
            "kind": "episode",
            "time": now,
            "episode": first + i,
            "return": ret,
            "length": length,
            "env_steps": counters.env_steps,
        }
        for i, (ret, length) in enumerate(
            zip(result.episode_returns, result.episode_lengths, strict=True)
        )
    ]
    if result.episode_returns:
        train: dict[str, Any] = {
            "kind": "train",
            "time": now,
            "episode": counters.episodes,
            "env_steps": counters.env_steps,
            "updates": counters.updates,
            "episodes": len(result.episode_returns),
        }
        if replay_size is not None:
            train["replay_size"] = replay_size
        for name in TRAIN_METRICS:
            value = train_metrics.get(name)
            if value is not None and math.isfinite(value):
                train[name] = value
        records.append(train)
    if result.evaluation is not None:
        records.append(
            {
                "kind": "eval",
                "time": now,
                "episode": counters.episodes,
                "env_steps": counters.env_steps,
                "updates": counters.updates,
                "mean": result.evaluation.mean,
                "std": result.evaluation.std,
                "best": counters.best_eval,
            }
        )
    return records
