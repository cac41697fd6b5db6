"""`fedrl-client`: the participant's command line.

`fedrl-client [OPTIONS]` trains; later subcommands (e.g. `fedrl-client plot`)
attach to the same group with `main.add_command`.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import click

from fedrl.client.backtest import backtest
from fedrl.client.config import TrainConfig, config_from_options, train_options
from fedrl.client.engine import Counters, PollResult, TrainingEngine
from fedrl.client.export import export_command
from fedrl.client.network import architecture_name
from fedrl.client.plot import plot_command
from fedrl.client.progress import ProgressReporter, TrainingProgress, mean_epsilon
from fedrl.client.state_dir import Autosaver, ModelIdentity, StateDir, StateError
from fedrl.client.system_check import check_command


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
        reporter = ProgressReporter(interval_s=config.log_interval)
        progress = TrainingProgress(
            reporter,
            target=config.episodes,
            epsilon=mean_epsilon(
                max(1, config.engine.workers) * config.engine.envs_per_worker,
                base=config.engine.exploration_base,
                alpha=config.engine.exploration_alpha,
            ),
            replay_size=lambda: len(engine.learner.replay),
        )

        def on_poll(result: PollResult) -> None:
            autosave(result)
            progress(engine.counters, result)

        def done(c: Counters) -> bool:
            return c.episodes >= config.episodes or 0 < config.max_env_steps <= c.env_steps

        try:
            engine.run(done, on_poll=on_poll)
        except KeyboardInterrupt:
            reporter.write("interrupted: saving")
        finally:
            reporter.close()
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


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


main.add_command(plot_command)
main.add_command(check_command)
main.add_command(export_command)
main.add_command(backtest)
