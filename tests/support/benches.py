"""RunResults made by hand, for tests of bench.federation's figures without running anything."""

from __future__ import annotations

from bench.federation.participant import ParticipantReport
from bench.federation.results import RunResult
from bench.federation.settings import Configuration, Mode


def make_run(
    mode: Mode,
    n: int,
    seed: int,
    returns: list[float],
    *,
    target: float = 475.0,
    every: int = 100,
    replay_ratio: float | None = None,
    updates: tuple[int, ...] = (),
    updates_per_step: float = 0.5,
    cpu: tuple[float, ...] = (),
    versions: list[int] | None = None,
    own_returns: list[float] | None = None,
) -> RunResult:
    """A run scored `returns` at marks every `every` steps each, one second and one CPU second
    per mark. Each process's updates: `updates` (one total per process, made evenly over the
    run) or `updates_per_step` at every mark. The local model scored unless `versions` are
    given; participant 0's own scores are `returns` unless given."""
    configuration = Configuration(n=n, mode=mode, replay_ratio=replay_ratio)
    marks = [every * (i + 1) for i in range(len(returns))]
    steps = [m * configuration.pooled_over for m in marks]
    participants = []
    for i in range(configuration.processes):
        total = updates[i] if updates else round(updates_per_step * steps[-1])
        participants.append(
            ParticipantReport(
                learns=True,
                env_steps=steps[-1],
                episodes=10,
                updates=total,
                foreign_received=0,
                cpu_seconds=cpu[i] if cpu else float(len(marks)),
                mark_ms=[1000 * (k + 1) for k in range(len(marks))],
                mark_cpu=[float(k + 1) for k in range(len(marks))],
                mark_steps=steps,
                mark_updates=[total * s // steps[-1] for s in steps],
            )
        )
    return RunResult(
        configuration=configuration,
        seed=seed,
        marks=marks,
        returns=returns,
        seconds=[float(k + 1) for k in range(len(marks))],
        versions=[-1] * len(marks) if versions is None else versions,
        own_returns=returns if own_returns is None else own_returns,
        initial_return=9.0,
        participants=participants,
        total_versions=0,
        run_seconds=float(len(marks)),
        server_cpu_seconds=0.0,
        target=target,
    )
