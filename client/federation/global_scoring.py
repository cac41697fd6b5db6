"""Scores adopted global versions off the training path, so the session knows its best one.

The server keeps the best global version by the greedy returns participants
report for it. A participant scores a version it adopts on evaluation envs
of its own, in a thread of its own: the training loop only hands the
version over and later collects the score, so training never waits for an
evaluation (a good CartPole model plays 10 × 500 greedy steps) and the
learner's state is never touched (the scorer has its own network copy,
envs and seeds, fedrl.client.training.engine.TrainingEngine.scorer).

How often is the session's choice (SessionConfig.global_eval_interval, in
this participant's env steps), so a group's scores add up to a steady rate
whatever its size. A version offered while the previous one is still being
scored replaces the waiting one: the newest is the one worth knowing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.evaluation import Scorer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionScore:
    """A global version's mean greedy return on this participant's evaluation envs."""

    version: int
    mean_return: float


class GlobalScoring:
    """A thread that scores offered global versions, one at a time, newest first."""

    def __init__(self, scorer: Scorer, *, interval_env_steps: int) -> None:
        """`interval_env_steps` between scored versions (0: every version offered)."""
        if interval_env_steps < 0:
            raise ValueError(f"interval_env_steps must be >= 0, got {interval_env_steps}")
        self._scorer = scorer
        self._interval = interval_env_steps
        self._next_at = 0
        self._lock = threading.Condition()
        self._waiting: tuple[int, NamedArrays] | None = None
        self._scores: list[VersionScore] = []
        self._closed = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="fedrl-global-scoring", daemon=True)
        self._thread.start()

    def set_interval(self, interval_env_steps: int) -> None:
        """Follow the session's rate (it arrives with the join reply)."""
        with self._lock:
            self._interval = max(0, interval_env_steps)

    def offer(self, version: int, tensors: NamedArrays, *, env_steps: int) -> bool:
        """Score this version if one is due at `env_steps`; whether it was taken."""
        with self._lock:
            if self._closed or env_steps < self._next_at:
                return False
            self._next_at = env_steps + self._interval
            self._waiting = (version, tensors)
            self._lock.notify()
            return True

    def take_scores(self) -> list[VersionScore]:
        """Scores finished since the last call, oldest first."""
        with self._lock:
            scores, self._scores = self._scores, []
            return scores

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is waiting or being scored (tests, and the last push); True if so."""
        with self._lock:
            return self._lock.wait_for(
                lambda: self._waiting is None and not self._busy, timeout=timeout_s
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._waiting = None
            self._lock.notify_all()
        self._thread.join(timeout=60)
        self._scorer.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._waiting is not None or self._closed)
                if self._closed:
                    return
                assert self._waiting is not None
                (version, tensors), self._waiting = self._waiting, None
                self._busy = True
            try:
                result = self._scorer.score(tensors)
            except Exception:
                # A scoring failure must not stop training; the version stays unscored.
                log.exception("scoring global version %d failed", version)
                result = None
            with self._lock:
                self._busy = False
                if result is not None:
                    self._scores.append(VersionScore(version, result.mean))
                self._lock.notify_all()
