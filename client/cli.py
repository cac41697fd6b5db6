"""`fedrl-client`: the participant's command line.

`fedrl-client [OPTIONS]` trains; later subcommands (e.g. `fedrl-client plot`)
attach to the same group with `main.add_command`.
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Any

import click

from fedrl.client.config import TrainConfig, config_from_options, train_options
from fedrl.client.engine import Counters, PollResult, TrainingEngine
from fedrl.client.network import architecture_name
from fedrl.client.state_dir import Autosaver, ModelIdentity, StateDir, StateError


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@train_options
@click.pass_context
def main(ctx: click.Context, /, **options: Any) -> None:
    """fedrl participant: trains locally and federates with a fedrl server.

    Without a subcommand it trains, e.g.
    `fedrl-client --participant-id Макар --offline --env CartPole-v1 --episodes 500`.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not options.get("participant_id"):
        raise click.UsageError("--participant-id is required to train")
    try:
        config = config_from_options(options)
        if not config.offline:
            raise click.UsageError(
                "training with a server is not available yet; pass --offline to train alone"
            )
        train_offline(config)
    except (ValueError, StateError) as exc:
        raise click.ClickException(str(exc)) from exc


def train_offline(config: TrainConfig) -> Counters:
    """Trains alone until the episode or step budget, resuming from and saving to the state dir.

    Ctrl-C or SIGTERM stops at the next round and saves everything first.
    """
    identity = ModelIdentity(
        env=config.engine.env,
        architecture=architecture_name(config.learner.hidden, config.learner.dueling),
    )
    state = StateDir(config.state_dir, config.participant_id, identity)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    engine = TrainingEngine(config.engine, config.learner)
    try:
        autosave = Autosaver(
            state,
            engine,
            model_every=config.save_model_every,
            progress_every=config.save_progress_every,
        )
        resumed = autosave.resume()
        if resumed is not None:
            click.echo(
                f"resuming {state.participant_id} at episode {resumed.episodes}, "
                f"{resumed.env_steps} env steps",
                err=True,
            )
        engine.start()
        log = _ProgressLog(config.log_interval)

        def on_poll(result: PollResult) -> None:
            autosave(result)
            log(engine.counters, result)

        def done(c: Counters) -> bool:
            return c.episodes >= config.episodes or 0 < config.max_env_steps <= c.env_steps

        try:
            engine.run(done, on_poll=on_poll)
        except KeyboardInterrupt:
            click.echo("interrupted: saving", err=True)
        autosave.save_all()
        counters = engine.counters
        click.echo(
            f"stopped at episode {counters.episodes}, {counters.env_steps} env steps; "
            f"best evaluation {_fmt(counters.best_eval)}; state in {state.path}",
            err=True,
        )
        return counters
    finally:
        engine.close()
        state.close()
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class _ProgressLog:
    """One line on stderr every `interval` seconds, and one per evaluation."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._last = time.monotonic()

    def __call__(self, counters: Counters, result: PollResult) -> None:
        now = time.monotonic()
        if result.evaluation is None and now - self._last < self._interval:
            return
        self._last = now
        recent = counters.recent_returns[-20:]
        mean = sum(recent) / len(recent) if recent else None
        line = (
            f"episode {counters.episodes}  env steps {counters.env_steps}  "
            f"updates {counters.updates}  return(20) {_fmt(mean)}"
        )
        if result.evaluation is not None:
            line += f"  eval {result.evaluation.mean:.1f}" + (" (best)" if result.new_best else "")
        click.echo(line, err=True)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
