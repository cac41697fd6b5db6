"""What is scored: the model of every mark, played greedily after the run; when a target is reached.

The models are scored by the bench, after the run, so scoring takes no CPU
from training: for modes with a global model the newest version the server
had committed when the participants passed a mark (the median of their
times), otherwise participant 0's own weights, written at that mark.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.federation.participant import (
    ParticipantReport,
    Weights,
    engine_configs,
    load_weights,
)
from bench.federation.settings import Configuration, Settings
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.evaluation import Evaluator, Scorer
from fedrl.proto.v1 import federation_pb2 as pb

EVALUATION_SEED = 7_919
"""Mixed with the run seed into the evaluation envs' seed stream: every configuration of a
seed plays the same episode starts at the same mark."""


def reached_at(returns: Sequence[float], target: float, *, consecutive: int = 2) -> int | None:
    """Index of the first of `consecutive` marks in a row scoring at least `target`; None if none.

    Two in a row by default: one lucky score of a still-wobbling model does
    not count as solved.
    """
    if consecutive < 1:
        raise ValueError(f"consecutive must be at least 1, got {consecutive}")
    run = 0
    for index, value in enumerate(returns):
        run = run + 1 if value >= target else 0
        if run == consecutive:
            return index - consecutive + 1
    return None


def evaluator(env: str, episodes: int, seed: int) -> Evaluator:
    """Greedy episodes on envs of the bench's own, seeded per run seed."""
    return Evaluator(
        env,
        episodes=episodes,
        seed=np.random.SeedSequence([seed, EVALUATION_SEED]),
        max_steps=100_000,
    )


@dataclass(frozen=True)
class Curve:
    """A run's scores, as score_run finds them."""

    returns: list[float]
    seconds: list[float]
    versions: list[int]
    own_returns: list[float]
    initial_return: float


def score_run(
    configuration: Configuration,
    seed: int,
    settings: Settings,
    *,
    run_dir: Path,
    start_ms: int,
    reports: Sequence[ParticipantReport],
    versions: Sequence[pb.VersionState],
    initial: Weights,
) -> Curve:
    """Score the model of every mark: the newest global version by then, or p0's own weights;
    and p0's own weights in any case (the same scores where those are what is scored)."""
    engine_config, learner = engine_configs(settings, seed, configuration.algo)
    probe = TrainingEngine(engine_config, learner)
    network = probe.learner.online
    probe.close()

    # One evaluator per run and model, used once per mark in order: mark i of
    # every configuration of this seed is played from the same episode starts.
    def new_scorer() -> Scorer:
        return Scorer(network, evaluator(settings.env, settings.eval_episodes, seed))

    scorer = new_scorer()
    # Where p0's own weights are what is scored, their scores are the curve's.
    own_scorer = None if configuration.scores_local_model else new_scorer()
    created = [v.created_unix_ms for v in versions]
    returns: list[float] = []
    own_returns: list[float] = []
    seconds: list[float] = []
    scored: list[int] = []
    try:
        for index, mark in enumerate(settings.marks):
            own = load_weights(run_dir / "p0" / "local" / f"{mark}.npz")
            when: float
            if configuration.scores_local_model:
                when = reports[0].mark_ms[index]
                weights = own
                scored.append(-1)
            else:
                when = statistics.median(p.mark_ms[index] for p in reports)
                # The newest version committed by then (created times are the
                # server's clock, on this machine). Version 0 was committed
                # before the start, so there always is one.
                newest = max(0, int(np.searchsorted(created, when, side="right")) - 1)
                weights = load_checkpoint(run_dir / "server" / versions[newest].checkpoint)
                scored.append(versions[newest].version)
            seconds.append((when - start_ms) / 1000)
            returns.append(scorer.score(weights).mean)
            own_returns.append(returns[-1] if own_scorer is None else own_scorer.score(own).mean)
        initial_return = scorer.score(initial).mean
    finally:
        scorer.close()
        if own_scorer is not None:
            own_scorer.close()
    return Curve(
        returns=returns,
        seconds=seconds,
        versions=scored,
        own_returns=own_returns,
        initial_return=initial_return,
    )


def load_checkpoint(path: Path) -> Weights:
    """A global version's checkpoint from the server's data dir."""
    with np.load(path, allow_pickle=False) as archive:
        return [(name, np.array(archive[name])) for name in archive.files]
