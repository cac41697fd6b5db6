"""`fedrl-client`: the participant's command line.

`fedrl-client [OPTIONS]` trains; later subcommands (e.g. `fedrl-client plot`)
attach to the same group with `main.add_command`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Protocol

import click
import grpc

from fedrl.client.commands.backtest import backtest
from fedrl.client.commands.check.command import check_command
from fedrl.client.commands.config import TrainConfig, check_algorithm_options, train_config_toml
from fedrl.client.commands.export import export_command
from fedrl.client.commands.game_defaults import describe, with_game_defaults
from fedrl.client.commands.gpu_stats import GpuMonitor
from fedrl.client.commands.learners import (
    SignalHandlers,
    launch_learners,
    restore_signals,
    run_rank,
    stop_on_signals,
    with_default_workers,
)
from fedrl.client.commands.plot import plot_command
from fedrl.client.commands.progress import ProgressReporter, TrainingProgress, mean_epsilon
from fedrl.client.commands.record import record_command
from fedrl.client.commands.show_config import config_command
from fedrl.client.commands.state_dir import (
    PARTICIPANT_ID_FILE,
    Autosaver,
    ModelIdentity,
    StateDir,
    StateError,
)
from fedrl.client.commands.training_events import TrainingEvents, tensorboard_dir
from fedrl.client.federation.channel import ChannelSecurityError
from fedrl.client.federation.errors import ServerCallError, SyncError
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.population import PopulationError, PopulationMember
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.training.counters import Counters, PollResult
from fedrl.client.training.distributed import RankFailureError, RankGroup, RankPlace
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.learner import Learner
from fedrl.client.training.memory import memory_use
from fedrl.common.config_cli import (
    explicit_settings,
    print_config_option,
    refuse_options_before_a_command,
    takes_config,
)
from fedrl.common.config_help import ConfigGroup
from fedrl.common.identity import validate_participant_id
from fedrl.common.status_table import hyperparameter_text, render_status
from fedrl.common.tls import TlsMaterialError
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

COMMON = (
    "participant_id",
    "server",
    "session",
    "offline",
    "algo",
    "episodes",
    "env",
    "workers",
    "device",
    "share",
    "bundle",
    "state_dir",
)
"""The options `fedrl-client --help` shows; the rest by section (--help-section, --help-all)."""


@click.group(
    cls=ConfigGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@takes_config(TrainConfig, common=COMMON, config_file=True)
@print_config_option
@click.pass_context
def main(ctx: click.Context, /, config: TrainConfig, print_config: bool) -> None:
    """fedrl participant: trains locally and federates with a fedrl server.

    Without a command it trains with the session on --server, e.g.
    `fedrl-client --participant-id Макар --server host:7443 --env CartPole-v1`,
    or alone with --offline; `--config run.toml` reads the settings from a file
    (`fedrl-client config` prints a run's). `--episodes 0` prints the session's status.
    """
    if ctx.invoked_subcommand is not None:
        refuse_options_before_a_command(ctx)
        return
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    explicit = explicit_settings(ctx)
    given = explicit.names
    try:
        check_algorithm_options(config, explicit.changed)
    except ValueError as exc:
        raise click.UsageError(explicit.blamed(str(exc))) from None
    try:
        check_bundle_identity(config)
        # torchrun's variables make this process one rank; --learners starts the ranks here.
        place = RankPlace.from_env()
        ranked = place is not None and place.world_size > 1
        # Every rank on this machine keeps a replay of its own: a game's replay
        # fills its share of the memory.
        replays = place.local_world_size if place is not None and ranked else config.learners
        config, settings = with_game_defaults(config, given, replays=replays)
        if print_config:
            click.echo(train_config_toml(config), nl=False)
            return
        if settings and config.episodes:
            click.echo(f"game settings for {config.engine.env}: {describe(settings)}", err=True)
        if config.episodes == 0:
            if config.offline:
                raise click.UsageError("--episodes 0 shows the session's status: drop --offline")
            print_status(config)
            return
        if config.offline and not config.participant_id:
            raise click.UsageError("--participant-id is required to train")
        if not config.offline:
            config = resolve_participant_id(config)
        if place is not None and ranked:
            if "workers" not in given:
                config = with_default_workers(config, place.local_world_size)
            run_rank(config, place, train)
        elif config.learners > 1:
            if "workers" not in given:
                config = with_default_workers(config, config.learners)
            launch_learners(config, train)
        else:
            train(config)
    except (
        ValueError,
        StateError,
        SyncError,
        ServerCallError,
        TlsMaterialError,
        RankFailureError,
        PopulationError,
    ) as exc:
        raise click.ClickException(str(exc)) from exc


def train(config: TrainConfig, ranks: RankGroup | None = None) -> Counters:
    """Train alone, with the session or in its population, here or as rank 0 of `ranks`."""
    if config.offline:
        return train_offline(config, ranks)
    if config.mode == "pbt":
        return train_population(config, ranks)
    return train_federated(config, ranks)


def train_offline(config: TrainConfig, ranks: RankGroup | None = None) -> Counters:
    """Trains alone until the episode or step budget, resuming from and saving to the state dir.

    Ctrl-C or SIGTERM stops at the next round and saves everything first. As
    rank 0 of several learners, so does another rank's death, before the
    error is raised.
    """
    engine = TrainingEngine(
        config.engine, config.learner_config, network=config.network, ranks=ranks
    )
    state = open_state_dir(config, engine)
    previous = _stop_signals(engine, ranks)
    try:
        echo_memory(engine)
        autosave = _autosaver(config, state, engine)
        resumed = autosave.resume()
        if resumed is not None:
            click.echo(
                f"resuming {state.participant_id} at episode {resumed.episodes}, "
                f"{resumed.env_steps} env steps",
                err=True,
            )
        start, reporter, progress = _start(config, engine, state)

        def on_poll(result: PollResult) -> None:
            autosave(result)
            progress(engine.counters, result)

        def done(c: Counters) -> bool:
            return _budget_spent(config, c, start)

        failure: RankFailureError | None = None
        try:
            engine.run(done, on_poll=on_poll)
        except KeyboardInterrupt:
            reporter.write("interrupted: saving")
        except RankFailureError as exc:
            failure = exc
        finally:
            reporter.close()
        autosave.save_all()
        if failure is not None:
            raise _saved_after(failure, engine.counters, state.path)
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
        restore_signals(previous)


def train_federated(config: TrainConfig, ranks: RankGroup | None = None) -> Counters:
    """Trains with the session on config.server until this run's episodes or the session goal.

    The session is joined before anything is written, so a refused model
    (another env or network) exits with the server's reason and leaves the
    state dir as it was. Ctrl-C or SIGTERM stops at the next round, pushes
    and saves. At the end the session's status table is printed.
    """
    engine = TrainingEngine(
        config.engine,
        config.learner_config,
        network=config.network,
        learn=config.role == "learner",
        ranks=ranks,
    )
    with _session_run(config, engine, ranks) as run:
        state, autosave = run.state, run.autosave
        sync = SyncLoop(
            engine,
            state_dir=state.path / "sync" / config.session,
            participant_id=config.participant_id,
            session=config.session,
            spec=run.spec,
            channel_factory=lambda: _channel(config),
            share=config.effective_share,
            plan=config.sync_plan(),
            exchange=config.exchange,
            target_at_adoption=config.target_at_adoption,
            on_record=lambda record: state.append_metrics([record]),
        )
        run.closes_first(sync)
        joined = sync.start()
        if engine.counters.episodes:
            click.echo(
                f"resuming {state.participant_id} at episode {engine.counters.episodes}, "
                f"{engine.counters.env_steps} env steps",
                err=True,
            )
        if joined is not None and config.total_episodes:
            goal = sync.raise_goal(config.total_episodes)
            click.echo(f"session goal: {goal.total_episodes} episodes", err=True)
        start, reporter, progress = _start(config, engine, state)

        def on_poll(result: PollResult) -> None:
            autosave(result)
            sync.after_poll(result)
            progress(engine.counters, result, sync.view, sync_mode=sync.sync_mode)

        interrupted, failure = _poll_in_session(
            engine,
            reporter,
            on_poll,
            goal_reached=lambda: sync.goal_reached,
            budget_spent=lambda counters: _budget_spent(config, counters, start),
            on_interrupt="pushing and saving",
        )
        left = sync.finish(flush_timeout_s=10.0 if interrupted or failure else 60.0)
        autosave.save_all()
        if failure is not None:
            raise _saved_after(failure, engine.counters, state.path)
        counters = engine.counters
        view = sync.view
        click.echo(
            f"stopped at episode {counters.episodes} ({counters.episodes - start} this run), "
            f"{counters.env_steps} env steps; best local evaluation {_fmt(counters.best_eval)}; "
            f"{view.acknowledged} updates acknowledged ({view.duplicates} recognised as resent); "
            f"state in {state.path}" + (f"; {left} updates wait in the outbox" if left else ""),
            err=True,
        )
        if view.connected:
            _echo_status(sync.status(), state.path)
        return counters


def train_population(config: TrainConfig, ranks: RankGroup | None = None) -> Counters:
    """Trains as a member of the population session on config.server (population-based training).

    Alone, with its own hyperparameters; after every evaluation it reports its
    model and score, and when ranked into the bottom copies a better member's
    weights and explores (fedrl.client.federation.population). Stops, saves and
    ends with the session's status as train_federated does.
    """
    engine = TrainingEngine(
        config.engine, config.learner_config, network=config.network, ranks=ranks
    )
    with _session_run(config, engine, ranks) as run:
        state, autosave = run.state, run.autosave
        member = PopulationMember(
            engine,
            participant_id=config.participant_id,
            session=config.session,
            spec=run.spec,
            channel_factory=lambda: _channel(config),
            on_record=lambda record: state.append_metrics([record]),
        )
        run.closes_first(member)
        member.start()
        click.echo(
            f"{state.participant_id}: member of population {config.session!r}, generation "
            f"{member.generation}, {hyperparameter_text(engine.hyperparameters())}",
            err=True,
        )
        start, reporter, progress = _start(config, engine, state)

        def on_poll(result: PollResult) -> None:
            autosave(result)
            generation = member.generation
            member.after_poll(result)
            if member.generation != generation:
                # The copied model is this member's now: keep it before anything else.
                autosave.save_all()
            progress(engine.counters, result, generation=member.generation)

        interrupted, failure = _poll_in_session(
            engine,
            reporter,
            on_poll,
            goal_reached=lambda: member.goal_reached,
            budget_spent=lambda counters: _budget_spent(config, counters, start),
            on_interrupt="reporting and saving",
        )
        member.finish(timeout_s=10.0 if interrupted or failure else 60.0)
        autosave.save_all()
        if failure is not None:
            raise _saved_after(failure, engine.counters, state.path)
        counters = engine.counters
        click.echo(
            f"stopped at episode {counters.episodes} ({counters.episodes - start} this run), "
            f"{counters.env_steps} env steps; generation {member.generation}, "
            f"{member.reports} reports taken; best local evaluation {_fmt(counters.best_eval)}; "
            f"state in {state.path}",
            err=True,
        )
        _echo_status(member.status(), state.path)
        return counters


@dataclasses.dataclass(frozen=True)
class _SessionRun:
    """What a run in a session works with, and the stack that closes it all in reverse order."""

    state: StateDir
    autosave: Autosaver
    spec: tpb.ModelSpec
    _stack: contextlib.ExitStack

    def closes_first(self, part: _Closable) -> None:
        """Close `part` before the engine, the state dir and the signal handlers."""
        self._stack.callback(part.close)


class _Closable(Protocol):
    def close(self) -> None: ...


@contextmanager
def _session_run(
    config: TrainConfig, engine: TrainingEngine, ranks: RankGroup | None
) -> Iterator[_SessionRun]:
    """The state dir (closing the engine if its id is refused), stop signals, a resumed
    autosaver and the model spec; on exit, what the run registered, then the engine, the
    state dir and the previous signal handlers."""
    state = open_state_dir(config, engine)
    previous = _stop_signals(engine, ranks)
    with contextlib.ExitStack() as stack:
        stack.callback(restore_signals, previous)
        stack.callback(state.close)
        stack.callback(engine.close)
        echo_memory(engine)
        autosave = _autosaver(config, state, engine)
        autosave.resume()
        yield _SessionRun(state, autosave, _model_spec(config, engine, state), stack)


def _autosaver(config: TrainConfig, state: StateDir, engine: TrainingEngine) -> Autosaver:
    return Autosaver(
        state,
        engine,
        model_every=config.save_model_every,
        progress_every=config.save_progress_every,
    )


def _model_spec(config: TrainConfig, engine: TrainingEngine, state: StateDir) -> tpb.ModelSpec:
    """What the server checks a joining participant's model against: env, shapes, architecture."""
    return model_spec(
        config.engine.env,
        engine.weights(),
        state.identity.architecture,
        data=config.engine.data,
    )


def _start(
    config: TrainConfig, engine: TrainingEngine, state: StateDir
) -> tuple[int, ProgressReporter, TrainingProgress]:
    """Records the run's configuration in the state dir, starts the engine and the progress
    lines; this run's --episodes count from `start`."""
    state.save_config(train_config_toml(config))
    engine.start()
    start = engine.counters.episodes
    reporter = ProgressReporter(interval_s=config.log_interval)
    progress = TrainingProgress(
        reporter,
        target=start + config.episodes,
        epsilon=_epsilon(config),
        replay_size=lambda: engine.replay_size,
        gpus=_gpu_monitor(reporter),
    )
    return start, reporter, progress


def _budget_spent(config: TrainConfig, counters: Counters, start: int) -> bool:
    """This run's own budget: --episodes since `start`, or --max-env-steps in all (0: none)."""
    return counters.episodes - start >= config.episodes or (
        0 < config.max_env_steps <= counters.env_steps
    )


def _poll_in_session(
    engine: TrainingEngine,
    reporter: ProgressReporter,
    on_poll: Callable[[PollResult], None],
    *,
    goal_reached: Callable[[], bool],
    budget_spent: Callable[[Counters], bool],
    on_interrupt: str,
) -> tuple[bool, RankFailureError | None]:
    """Polls until the session's goal or this run's budget is reached; (interrupted, failure).

    Ctrl-C and another rank's death end the polling but are returned, not
    raised, so that the caller still hands its work to the server (in a
    shorter time) and saves before it raises the failure.
    """
    try:
        # As rank 0 of several, a stop takes effect once the ranks agree on it.
        while not engine.stopping:
            on_poll(engine.poll())
            if goal_reached():
                reporter.write("the session reached its goal")
                engine.request_stop()
            elif budget_spent(engine.counters):
                engine.request_stop()
    except KeyboardInterrupt:
        reporter.write(f"interrupted: {on_interrupt}")
        return True, None
    except RankFailureError as exc:
        return False, exc
    finally:
        reporter.close()
    return False, None


def open_state_dir(config: TrainConfig, engine: TrainingEngine) -> StateDir:
    """The participant's state dir, for the model the engine builds (closing the engine if the
    id is refused); its metrics also go to TensorBoard unless --tensorboard off."""
    identity = ModelIdentity(
        env=config.engine.env, architecture=config.architecture(engine.obs_shape)
    )
    try:
        logdir = tensorboard_dir(config.tensorboard, config.state_dir, config.participant_id)
        events = None if logdir is None else TrainingEvents(logdir, epsilon=_epsilon(config))
        return StateDir(config.state_dir, config.participant_id, identity, events=events)
    except BaseException:
        engine.close()
        raise


def echo_memory(engine: TrainingEngine) -> None:
    """One line at start: what the replay and the shared-memory slots take, and what is free."""
    workers = engine.config.workers
    in_process = workers == 0 or (engine.on_policy and workers == 1)
    layout = None if in_process else engine.ring_layout(workers)
    slots = 0 if layout is None else layout.num_slots * layout.slot_bytes
    if isinstance(engine.learner, Learner):
        use = memory_use(
            engine.learner.replay.nbytes,
            engine.learner.config.replay_capacity,
            engine.obs_shape,
            slots,
        )
        click.echo(use.describe(), err=True)
    elif slots:
        click.echo(f"memory: shared-memory rollout slots {slots / 1e6:.1f} MB", err=True)


def print_status(config: TrainConfig) -> None:
    """`--episodes 0`: the session's global state as tables; reads only, changes nothing."""

    # Over TLS the server checks the id a call names against the credentials.
    pid = config.participant_id
    bundle = config.tls.read_bundle()
    if not pid and bundle is not None:
        pid = bundle.participant_id

    async def fetch() -> pb.StatusReply:
        async with _channel(config) as channel:
            client = FederationClient(
                channel, participant_id=pid or "status", session=config.session
            )
            return await client.status(max_versions=10)

    reply = asyncio.run(fetch())
    if not reply.sessions:
        raise click.ClickException(f"the server has no session {config.session!r} yet")
    _echo_status(reply, None)


def _echo_status(reply: pb.StatusReply, local: Path | None) -> None:
    click.echo(render_status(reply))
    for session in reply.sessions:
        if session.best_checkpoint:
            best = session.best_eval_return if session.HasField("best_eval_return") else None
            click.echo(
                f"best global model of {session.session!r}: version {session.best_version} "
                f"(evaluation {_fmt(best)}), {session.best_checkpoint} under the server's data dir"
            )
    if local is not None and (local / "best.pt").exists():
        click.echo(f"this participant's best local model: {local / 'best.pt'}")


def _channel(config: TrainConfig) -> grpc.aio.Channel:
    try:
        return config.tls.open(config.server)
    except ChannelSecurityError as exc:
        raise click.UsageError(str(exc)) from exc


def check_bundle_identity(config: TrainConfig) -> None:
    """Refuse a --participant-id that is not the bundle's: the server would refuse every call."""
    bundle = config.tls.read_bundle()
    if bundle is None or not config.participant_id:
        return
    given = validate_participant_id(config.participant_id)
    if given != bundle.participant_id:
        raise click.UsageError(
            f"--participant-id {given!r} differs from {bundle.participant_id!r}, the "
            f"participant of --bundle {config.tls.bundle}: a participant can only speak as itself"
        )


def resolve_participant_id(config: TrainConfig) -> TrainConfig:
    """The config with a participant id: the one given, or one generated once and remembered."""
    if config.participant_id:
        return config
    bundle = config.tls.read_bundle()
    if bundle is not None:
        # The bundle's certificate names the participant: nothing else could speak with it.
        return dataclasses.replace(config, participant_id=bundle.participant_id)
    path = config.state_dir / PARTICIPANT_ID_FILE
    if path.exists():
        pid = validate_participant_id(path.read_text(encoding="utf-8").strip())
    else:
        pid = f"participant-{secrets.token_hex(4)}"
        config.state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(pid + "\n", encoding="utf-8")
        click.echo(f"no --participant-id given: you are {pid} (remembered in {path})", err=True)
    return dataclasses.replace(config, participant_id=pid)


def _epsilon(config: TrainConfig) -> float | None:
    """DQN's mean exploration rate; PPO explores by its policy's own randomness."""
    if config.algo == "ppo":
        return None
    return mean_epsilon(
        max(1, config.engine.workers) * config.engine.envs_per_worker,
        base=config.engine.exploration_base,
        alpha=config.engine.exploration_alpha,
    )


def _gpu_monitor(reporter: ProgressReporter) -> GpuMonitor:
    """The GPUs for the progress line; where there are none, the run says so once."""
    monitor = GpuMonitor()
    if monitor.none_reason is not None:
        reporter.write(f"gpus: none ({monitor.none_reason})")
    return monitor


def _stop_signals(engine: TrainingEngine, ranks: RankGroup | None) -> SignalHandlers:
    """SIGTERM as Ctrl-C: alone, both interrupt at once; as ranks, both stop them at a round."""
    if ranks is not None:
        return stop_on_signals(engine)
    return {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_interrupt)}


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _saved_after(failure: RankFailureError, counters: Counters, path: Path) -> RankFailureError:
    return RankFailureError(
        f"{failure}. The run's state is saved at episode {counters.episodes} "
        f"({counters.env_steps} env steps) in {path}: run the same command to resume, with "
        "any --learners"
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


main.add_command(config_command)
main.add_command(plot_command)
main.add_command(check_command)
main.add_command(export_command)
main.add_command(backtest)
main.add_command(record_command)
