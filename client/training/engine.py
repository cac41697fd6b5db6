"""The participant's training engine: actors collect, the learner trains, evaluation keeps score.

One `TrainingEngine` drives everything below the command line and the sync
loop. `poll()` does one round and returns what happened, so a caller can
interleave its own work (autosave, federated sync) between rounds; `run()`
polls until a stop condition.

The algorithm is chosen by the learner's config, and with it one of two
schedules over the same actor processes, shared memory and serial mode:

- off-policy (DQN, `LearnerConfig`): actors stream n-step transitions into
  the replay while the learner trains at a fixed replay ratio, asynchronously;
- on-policy (PPO, `PPOConfig`): every actor collects one rollout with the
  newest weights, the learner takes one update from all of them together,
  publishes, and only then hands the slots back, so no step is ever
  collected with a policy older than the one being improved.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import copy
import dataclasses
import math
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.training.actor import (
    SLOT_FORMAT,
    ActorCore,
    ActorSpec,
    actor_process,
    make_actor_spec,
    parse_fill,
    slot_capacity,
)
from fedrl.client.training.distributed import RankGroup, RoundLedger, RoundOutcome, outcome_of
from fedrl.client.training.evaluation import EvalResult, Evaluator, Scorer, greedy_policy
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.frame_slots import FrameLayout, FrameSlot, SlotLayout
from fedrl.client.training.hyperparameters import (
    Hyperparameters,
    actors_need_restart,
    read_hyperparameters,
    with_hyperparameters,
)
from fedrl.client.training.learner import Learner, LearnerConfig, TargetAtAdoption
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_actor import PPOActorCore, PPOActorSpec
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.q_network import DEFAULT_NETWORK, load_named_arrays
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.shm import (
    BoardLayout,
    RingLayout,
    RolloutLayout,
    SlotFill,
    SlotRing,
    TransitionSlot,
    WeightsBoard,
)
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import env_shape, make_vector_env, observation_dtype
from fedrl.common.closing import Closing
from fedrl.common.config_cli import doc
from fedrl.envs.atari import is_atari


def available_cores() -> int:
    """Cores this process may run on (affinity-aware, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_workers() -> int:
    """One core stays with the learner; the rest act. One core means serial mode (0)."""
    return max(0, available_cores() - 1)


@dataclass(frozen=True)
class EngineConfig:
    """Collection, replay-ratio and evaluation knobs of the engine (the replay ones: DQN only)."""

    env: str = field(default="CartPole-v1", metadata=doc("Gymnasium environment id."))
    data: str | None = field(
        default=None,
        metadata=doc(
            "What the environment reads: for fedrl/Trading-v0 a CSV, Parquet or Arrow file "
            "of OHLCV bars, or a PostgreSQL URL (postgresql://user@host/db)."
        ),
    )
    workers: int = field(
        default_factory=default_workers,
        metadata=doc(
            "Actor processes; 0 runs the actor in the learner's process. Default: cores − 1."
        ),
    )
    envs_per_worker: int = field(default=16, metadata=doc("Envs each actor steps as one batch."))
    n_step: int = field(
        default=3, metadata=doc("Rewards summed into each transition before bootstrapping.")
    )
    exploration_base: float = field(
        default=0.4, metadata=doc("Ape-X ε_i = base^(1 + alpha·i/(N−1)) over all N envs.")
    )
    exploration_alpha: float = field(
        default=7.0, metadata=doc("Ape-X exponent spread: the greediest env gets base^(1 + alpha).")
    )
    replay_ratio: float = field(
        default=0.5,
        metadata=doc(
            "Gradient updates per env step (Fedus et al. 2020); SB3's CartPole zoo setting is 0.5."
        ),
    )
    steps_per_slot: int = field(
        default=8,
        metadata=doc("Vector steps an actor collects before handing its slot to the learner."),
    )
    slots_per_worker: int = field(
        default=4,
        metadata=doc(
            "Shared-memory slots per actor: how far collection may run ahead of the learner."
        ),
    )
    weights_interval: int = field(
        default=16, metadata=doc("Updates between publishing the learner's weights to the actors.")
    )
    eval_interval: int = field(
        default=5_000, metadata=doc("Env steps between greedy evaluations; 0 disables evaluation.")
    )
    eval_episodes: int = field(
        default=10, metadata=doc("Episodes per evaluation, played at once on envs of their own.")
    )
    eval_max_steps: int = field(
        default=100_000, metadata=doc("Step cap per evaluation, for envs without a time limit.")
    )
    max_actor_restarts: int = field(
        default=3, metadata=doc("Restarts of dead actors before the run stops with an error.")
    )
    learner_threads: int = field(
        default=1,
        metadata=doc("torch intra-op threads of the learner's process; actors use one each."),
    )
    seed: int = field(
        default=0,
        metadata=doc("Root of every seed stream: actors, envs, evaluation and the learner."),
    )
    clip_rewards: bool = field(
        default=True,
        metadata=doc("Atari games: train on the sign of each reward; scores stay raw."),
    )
    episodic_life: bool = field(
        default=True,
        metadata=doc(
            "Atari games, DQN: a lost life cuts the n-step return as an episode's end would; "
            "the game, its frames and its score go on."
        ),
    )

    def __post_init__(self) -> None:
        at_least = {
            "workers": (self.workers, 0),
            "envs_per_worker": (self.envs_per_worker, 1),
            "n_step": (self.n_step, 1),
            "steps_per_slot": (self.steps_per_slot, 1),
            "slots_per_worker": (self.slots_per_worker, 1),
            "weights_interval": (self.weights_interval, 1),
            "eval_interval": (self.eval_interval, 0),
            "eval_episodes": (self.eval_episodes, 1),
            "eval_max_steps": (self.eval_max_steps, 1),
            "max_actor_restarts": (self.max_actor_restarts, 0),
            "learner_threads": (self.learner_threads, 1),
        }
        for name, (value, low) in at_least.items():
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")
        if not self.replay_ratio > 0:
            raise ValueError(f"replay_ratio must be > 0, got {self.replay_ratio}")


class ActorFailureError(RuntimeError):
    """An actor process died more often than the engine may restart it."""


@dataclass(frozen=True)
class Counters:
    """Where training stands; what autosave persists and what resume restores."""

    episodes: int = 0
    env_steps: int = 0
    updates: int = 0
    best_eval: float | None = None
    last_eval: float | None = None
    recent_returns: tuple[float, ...] = ()


@dataclass(frozen=True)
class PollResult:
    """What one round did."""

    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    env_steps: int
    updates: int
    train_metrics: dict[str, float]
    evaluation: EvalResult | None
    new_best: bool
    policy_updates: int = 0
    """PPO: rollouts learned from in this round (the sync loop pushes after each); DQN: 0."""


@dataclass
class _ActorHandle:
    spec: ActorSpec | PPOActorSpec | FrameActorSpec
    process: BaseProcess
    free_slots: Connection
    filled_slots: Connection
    slots: range
    restarts: int = 0
    generation: int = 0
    """Lives before this one (restarts and respawns with new hyperparameters): its seed stream."""


class TrainingEngine(Closing):
    """Actors, learner and evaluation, in one process (workers=0) or across processes."""

    def __init__(
        self,
        config: EngineConfig,
        learner_config: LearnerConfig | PPOConfig,
        *,
        network: NetworkConfig = DEFAULT_NETWORK,
        recent_window: int = 100,
        learn: bool = True,
        ranks: RankGroup | None = None,
    ) -> None:
        """A PPOConfig trains PPO, a LearnerConfig DQN; `network` picks the torso of either.

        `learn=False` (DQN only) makes an engine that only acts: its actors play
        whatever model it is given and its batches go to the on_batch hooks,
        but nothing is stored or trained (a participant in the actor role).
        `ranks` makes this engine one learner rank of several
        (fedrl.client.training.distributed): every poll then starts with the
        ranks' exchange, counters are the sum over the ranks, and only rank 0
        evaluates.
        """
        self.config = config
        self._ranks = ranks
        # Counted here until the next exchange reports them to every rank.
        self._ledger = RoundLedger() if ranks is not None else None
        self._all_ready = False
        self._stop_requested = False
        self._stopping = False
        # Rank 0 shares its learner's whole state at start, and again after
        # anything but training changed it (resume, adoption, hyperparameters).
        self._state_changed = True
        self._seeds = np.random.SeedSequence(config.seed)
        actor_seeds, eval_seed, learner_seed = self._seeds.spawn(3)
        self._actor_seed_root = actor_seeds
        self._network = network
        on_policy = isinstance(learner_config, PPOConfig)
        probe = make_vector_env(config.env, 1, config.data, window=network.window)
        try:
            shape = env_shape(probe, continuous=on_policy)
        finally:
            probe.close()
        self.env_shape = shape
        self.obs_shape, self.n_actions = shape.obs_shape, shape.n_actions
        if not learn and on_policy:
            raise ValueError("PPO learns from its own rollouts: it has no acting-only role")
        if not learn and ranks is not None:
            raise ValueError(
                "an engine that only acts trains nothing, so it has no learner ranks to run: "
                "use one learner, or the learner role"
            )
        self.learns = learn
        # DQN on Atari's frame stacks: actors hand over single frames, the replay keeps
        # each once. (Other image envs send whole observations, whose frames the replay
        # still stores once where consecutive rows share them.)
        self.frames = not on_policy and is_atari(config.env)
        self.learner: Learner | PPOLearner
        if isinstance(learner_config, PPOConfig):
            self.learner = PPOLearner(
                obs_shape=self.obs_shape,
                shape=shape,
                config=replace(learner_config, seed=_seed_of(learner_seed)),
                network=network,
                gradients=ranks,
            )
        else:
            seeded = replace(learner_config, seed=_seed_of(learner_seed))
            self.learner = Learner(
                obs_shape=self.obs_shape,
                n_actions=self.n_actions,
                config=seeded,
                network=network,
                gradients=ranks,
            )
        self._batch_hooks: list[Callable[[LearnerTransitions], None]] = []
        self._evaluator = (
            Evaluator(
                config.env,
                data=config.data,
                episodes=config.eval_episodes,
                seed=eval_seed,
                max_steps=config.eval_max_steps,
                window=network.window,
            )
            if config.eval_interval and (ranks is None or ranks.leads)
            else None
        )
        self._episodes = 0
        self._env_steps = 0
        self._best_eval: float | None = None
        self._last_eval: float | None = None
        self._recent: collections.deque[float] = collections.deque(maxlen=recent_window)
        self._returns_log: list[tuple[float, int]] = []
        self._next_eval = config.eval_interval
        self._updates_at_publish = 0
        # Replay-ratio credit counts from the moment the replay is ready, so
        # the first update does not face a backlog of learning_starts·ratio.
        self._steps_when_ready: int | None = None
        self._updates_when_ready = 0
        self.foreign_received = 0
        """Other participants' transitions taken in (add_foreign), this run."""
        self._foreign_credit = 0.0
        """Local-step equivalents of the foreign transitions taken in (add_foreign)."""
        self._foreign_credit_when_ready = 0.0
        self._serial: ActorCore | PPOActorCore | FrameActorCore | None = None
        self._actors: list[_ActorHandle] = []
        self._ring: SlotRing[Any] | None = None
        self._board: WeightsBoard | None = None
        # PPO, by actor index: this round's rollouts, their slots held until the
        # update; then the slots of the last update, until the next round.
        self._rollouts: dict[int, tuple[int, Rollout]] = {}
        self._spent: dict[int, int] = {}
        self._started = False
        self._serial_generation = 0

    @property
    def on_policy(self) -> bool:
        """PPO (rollouts, one update each) rather than DQN (replay)."""
        return isinstance(self.learner, PPOLearner)

    @property
    def learning_started(self) -> bool:
        """DQN: whether the learner has begun updating, its replay (foreign transitions
        included) having reached learning_starts on every rank. False for PPO and for an
        engine that only acts."""
        return self._steps_when_ready is not None

    @property
    def replay_size(self) -> int | None:
        """Transitions in the DQN learner's replay; None for PPO, which keeps none."""
        return len(self.learner.replay) if isinstance(self.learner, Learner) else None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Starts collection with the learner's current weights."""
        if self._started:
            raise RuntimeError("engine already started")
        self._started = True
        # A last resort for callers that forget close(): actors and segments go at exit.
        atexit.register(self.close)
        torch.set_num_threads(self.config.learner_threads)
        if self._ranks is not None:
            self._share_state()
        workers = self.config.workers
        # PPO alternates collection and learning, each waiting for the other,
        # so one actor process would overlap with nothing: it runs in this
        # process instead, with the same seeds and so the same results, minus
        # a spawn and a copy through shared memory.
        if workers == 0 or (self.on_policy and workers == 1):
            self._serial = self._serial_actor(generation=0)
            self._serial.load_weights(self.learner.weights(), 0)
            return
        try:
            self._start_processes(workers)
        except BaseException:
            self.close()
            raise

    def _serial_actor(self, generation: int) -> ActorCore | PPOActorCore | FrameActorCore:
        """The one actor that runs in this process, for its `generation`'s seed stream."""
        spec = self._actor_spec(0, num_actors=1, generation=generation)
        if isinstance(spec, FrameActorSpec):
            return FrameActorCore(spec)
        if isinstance(spec, ActorSpec):
            return ActorCore(spec)
        return PPOActorCore(spec)

    def _start_processes(self, workers: int) -> None:
        per_actor = self._slots_per_actor
        self._ring = SlotRing(self.ring_layout(workers))
        weights = self.learner.weights()
        self._board = WeightsBoard(BoardLayout.of(weights))
        self._board.publish(weights)
        for index in range(workers):
            slots = range(index * per_actor, (index + 1) * per_actor)
            self._actors.append(self._spawn(index, slots, generation=0))

    def ring_layout(self, workers: int) -> SlotLayout:
        """The shared-memory slots `workers` actor processes fill (what start() allocates)."""
        per_actor = self._slots_per_actor
        layout: SlotLayout
        if self.frames:
            layout = FrameLayout(
                num_slots=workers * per_actor,
                steps=self.config.steps_per_slot,
                envs=self.config.envs_per_worker,
                frame_shape=self.obs_shape[1:],
                n_step=self.config.n_step,
            )
        elif isinstance(self.learner, PPOLearner):
            layout = RolloutLayout(
                num_slots=workers,
                steps=self.learner.config.rollout_steps,
                envs=self.config.envs_per_worker,
                obs_shape=self.obs_shape,
                action_shape=self.learner.action_shape,
                obs_dtype=self.learner.obs_dtype.name,
                frame_stacks=is_atari(self.config.env),
            )
        else:
            rows, episodes = slot_capacity(
                self.config.envs_per_worker, self.config.steps_per_slot, self.config.n_step
            )
            layout = RingLayout(
                num_slots=workers * per_actor,
                rows_per_slot=rows,
                episodes_per_slot=episodes,
                obs_shape=self.obs_shape,
                obs_dtype=np.dtype(observation_dtype(self.obs_shape)).name,
            )
        return layout

    @property
    def _slots_per_actor(self) -> int:
        # PPO: one rollout per actor per update; more slots would only let an
        # actor run ahead with weights the update is about to replace.
        return 1 if self.on_policy else self.config.slots_per_worker

    def _actor_spec(
        self, index: int, *, num_actors: int, generation: int
    ) -> ActorSpec | PPOActorSpec | FrameActorSpec:
        c = self.config
        if isinstance(self.learner, PPOLearner):
            entropy = self._actor_seed_root.entropy
            assert isinstance(entropy, int)
            return PPOActorSpec(
                index=index,
                env_id=c.env,
                data=c.data,
                num_envs=c.envs_per_worker,
                seed_entropy=entropy,
                # As for DQN's actors: a stream per (actor, life).
                seed_spawn_key=(*self._actor_seed_root.spawn_key, index, generation),
                steps_per_slot=self.learner.config.rollout_steps,
                hidden=self.learner.config.ppo_hidden,
                network=self._network,
                clip_rewards=c.clip_rewards and is_atari(c.env),
            )
        learner = self.learner.config
        spec = make_actor_spec(
            index,
            num_actors=num_actors,
            generation=generation,
            seed_root=self._actor_seed_root,
            env_id=c.env,
            data=c.data,
            num_envs=c.envs_per_worker,
            exploration_base=c.exploration_base,
            exploration_alpha=c.exploration_alpha,
            n_step=c.n_step,
            gamma=learner.gamma,
            hidden=learner.hidden,
            dueling=learner.dueling,
            steps_per_slot=c.steps_per_slot,
            network=self._network,
        )
        if self.frames:
            return FrameActorSpec(
                actor=spec, clip_rewards=c.clip_rewards, episodic_life=c.episodic_life
            )
        return spec

    def _spawn(
        self, index: int, slots: range, *, generation: int, restarts: int = 0
    ) -> _ActorHandle:
        assert self._ring is not None and self._board is not None
        ctx = mp.get_context("spawn")
        free_recv, free_send = ctx.Pipe(duplex=False)
        filled_recv, filled_send = ctx.Pipe(duplex=False)
        spec = self._actor_spec(index, num_actors=self.config.workers, generation=generation)
        process = ctx.Process(
            target=actor_process,
            name=f"fedrl-actor-{index}",
            kwargs={
                "spec": spec,
                "ring_name": self._ring.name,
                "ring_layout": self._ring.layout,
                "board_name": self._board.name,
                "board_layout": self._board.layout,
                "free_slots": free_recv,
                "filled_slots": filled_send,
            },
            daemon=True,
        )
        process.start()
        # The child has its own copies; closing ours lets EOF mean "gone".
        free_recv.close()
        filled_send.close()
        held = {slot for slot, _ in self._rollouts.values()} | set(self._spent.values())
        for slot in slots:
            if slot not in held:  # a held slot goes back after the update
                free_send.send_bytes(SLOT_FORMAT.pack(slot))
        return _ActorHandle(
            spec, process, free_send, filled_recv, slots, restarts=restarts, generation=generation
        )

    def close(self) -> None:
        """Stops actors and frees every shared-memory segment; safe to call twice."""
        atexit.unregister(self.close)
        if self._board is not None:
            self._board.request_stop()
        for actor in self._actors:
            with contextlib.suppress(OSError):
                actor.free_slots.close()
        for actor in self._actors:
            actor.process.join(timeout=5.0)
            if actor.process.is_alive():
                actor.process.kill()
                actor.process.join(timeout=5.0)
            with contextlib.suppress(OSError):
                actor.filled_slots.close()
        self._actors = []
        if self._serial is not None:
            self._serial.close()
            self._serial = None
        if self._evaluator is not None:
            self._evaluator.close()
            self._evaluator = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._board is not None:
            self._board.close()
            self._board = None

    def __enter__(self) -> Self:
        self.start()
        return self

    # -- the loop ------------------------------------------------------------

    def poll(self, *, timeout_s: float = 0.05) -> PollResult:
        """One round: take in experience, train what is due, publish, evaluate."""
        if not self._started:
            raise RuntimeError("call start() (or use the engine as a context manager) first")
        steps_before, updates_before = self._env_steps, self.learner.updates
        rounds_before = self.learner.rounds if isinstance(self.learner, PPOLearner) else 0
        # The ranks' counts join this rank's only once the round is done: a
        # round cut short by a dead rank leaves counters and metrics agreeing.
        counted = self._exchange() if self._ranks is not None else None
        if self._stopping:
            metrics, rounds = {}, 0
        elif isinstance(self.learner, PPOLearner):
            metrics = self._poll_rollouts(self.learner, timeout_s)
            rounds = self.learner.rounds - rounds_before
        else:
            metrics = self._poll_replay(self.learner, timeout_s)
            rounds = 0
        self._check_actors()
        if counted is not None:
            self._add_counts(counted.env_steps, counted.episode_returns, counted.episode_lengths)
            self._foreign_credit += counted.foreign_credit
        evaluation, new_best = self._maybe_evaluate()
        finished, self._returns_log = self._returns_log, []
        return PollResult(
            episode_returns=tuple(r for r, _ in finished),
            episode_lengths=tuple(n for _, n in finished),
            env_steps=self._env_steps - steps_before,
            updates=self.learner.updates - updates_before,
            train_metrics=metrics,
            evaluation=evaluation,
            new_best=new_best,
            policy_updates=rounds,
        )

    def _poll_replay(self, learner: Learner, timeout_s: float) -> dict[str, float]:
        """DQN: train what the replay ratio allows, take in new transitions, publish.

        In parallel mode new experience is taken only once the learner has
        done the updates it owes; a learner that falls behind thus holds the
        actors back through their bounded slots instead of letting the
        effective replay ratio drift with machine load.
        """
        metrics: dict[str, float] = {}
        owed = self._owed_updates(learner)
        if owed > 0:
            metrics = learner.train(owed if self._serial else min(owed, 64))
        if isinstance(self._serial, ActorCore):
            got = self._serial.collect(self.config.steps_per_slot)
            self._take(got.batch, got.env_steps, got.episode_returns, got.episode_lengths)
        elif isinstance(self._serial, FrameActorCore):
            frames = self._serial.collect(self.config.steps_per_slot)
            self._take_frames(
                0, frames.segment, frames.env_steps, frames.episode_returns, frames.episode_lengths
            )
        elif owed <= 0:
            for actor, fill in self._receive(timeout_s):
                self._take_fill(actor, fill)
        if learner.updates - self._updates_at_publish >= self.config.weights_interval:
            self._publish()
        return metrics

    def _poll_rollouts(self, learner: PPOLearner, timeout_s: float) -> dict[str, float]:
        """PPO: a rollout from every actor, then one update on all of them, then publish.

        The slots of an update go back to the actors at the start of the next
        round, not right after it: weights the caller sets in between (an
        adopted global model) thus reach every step collected after them.
        """
        if isinstance(self._serial, PPOActorCore):
            got = self._serial.collect()
            self._count(got.env_steps, got.episode_returns, got.episode_lengths)
            metrics = learner.train(got.rollout)
            self._publish()
            return metrics
        spent, self._spent = self._spent, {}
        for index, slot in spent.items():
            with contextlib.suppress(OSError):
                self._actors[index].free_slots.send_bytes(SLOT_FORMAT.pack(slot))
        for actor, fill in self._receive(timeout_s):
            self._take_fill(actor, fill)
        if not self._rollouts_complete():
            return {}
        ordered = [self._rollouts[index][1] for index in sorted(self._rollouts)]
        metrics = learner.train(Rollout.concat(ordered))
        self._publish()
        self._spent = {index: slot for index, (slot, _) in self._rollouts.items()}
        self._rollouts = {}
        return metrics

    def run(
        self,
        until: Callable[[Counters], bool],
        *,
        on_poll: Callable[[PollResult], None] | None = None,
    ) -> Counters:
        """Polls until `until(counters)` holds; `on_poll` sees every round (autosave, logging).

        As one rank of several it polls until the ranks agree to stop: when
        `until` holds here or any rank asked to (request_stop).
        """
        while True:
            if until(self.counters):
                if self._ranks is None:
                    break
                self.request_stop()
            if self._stopping:
                break
            result = self.poll()
            if on_poll is not None:
                on_poll(result)
        return self.counters

    def _owed_updates(self, learner: Learner) -> int:
        if not self.learns or not (learner.ready() if self._ranks is None else self._all_ready):
            return 0
        if self._steps_when_ready is None:
            self._steps_when_ready = self._env_steps
            self._updates_when_ready = learner.updates
            self._foreign_credit_when_ready = self._foreign_credit
        # N ranks step together on N batches, so an update per N env steps of
        # theirs (foreign transitions included) keeps each transition's
        # expected reuse at the replay ratio.
        world = 1 if self._ranks is None else self._ranks.world_size
        own = self._env_steps - self._steps_when_ready
        steps = own + (self._foreign_credit - self._foreign_credit_when_ready)
        if own > 0:
            learner.set_data_multiple(max(1.0, steps / own))
        credit = math.floor(self.config.replay_ratio * steps / world)
        return credit - (learner.updates - self._updates_when_ready)

    def _take(
        self,
        batch: LearnerTransitions,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        assert isinstance(self.learner, Learner)
        if len(batch):
            if self.learns:
                self.learner.add(batch)
            else:
                # Checked as the replay would check it: hooks get only valid rows.
                batch.validate(self.obs_shape)
            for hook in self._batch_hooks:
                hook(batch)
        self._count(env_steps, episode_returns, episode_lengths)

    def _take_fill(self, actor: _ActorHandle, fill: SlotFill) -> None:
        """Copy an announced slot out; DQN hands it straight back, PPO holds it for the update."""
        assert self._ring is not None
        slot = self._ring.slots[fill.slot]
        if isinstance(slot, FrameSlot):
            segment, returns, lengths = slot.read(fill)
            with contextlib.suppress(OSError):
                actor.free_slots.send_bytes(SLOT_FORMAT.pack(fill.slot))
            self._take_frames(actor.spec.index, segment, fill.env_steps, returns, lengths)
            return
        if isinstance(slot, TransitionSlot):
            batch, returns, lengths = slot.read(fill)
            with contextlib.suppress(OSError):
                actor.free_slots.send_bytes(SLOT_FORMAT.pack(fill.slot))
            self._take(batch, fill.env_steps, returns, lengths)
            return
        rollout, returns, lengths = slot.read(fill)
        if actor.spec.index in self._rollouts:
            raise ActorFailureError(f"actor {actor.spec.index} sent two rollouts for one update")
        self._rollouts[actor.spec.index] = (fill.slot, rollout)
        self._count(fill.env_steps, returns, lengths)

    def _take_frames(
        self,
        actor_index: int,
        segment: FrameSegment,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        """An actor's frames into the replay: its env j is stream index·E + j there."""
        assert isinstance(self.learner, Learner)
        streams = actor_index * segment.envs + np.arange(segment.envs)
        stored = self.learner.add_frames(streams, segment, rebuild=bool(self._batch_hooks))
        if stored is not None and len(stored):
            for hook in self._batch_hooks:
                hook(stored)
        self._count(env_steps, episode_returns, episode_lengths)

    def _count(
        self,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        if self._ledger is not None:
            self._ledger.hold(env_steps, episode_returns, episode_lengths)
        else:
            self._add_counts(env_steps, episode_returns, episode_lengths)

    def _add_counts(
        self,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        self._env_steps += env_steps
        self._episodes += len(episode_returns)
        self._recent.extend(float(r) for r in episode_returns)
        self._returns_log.extend(
            (float(r), int(n)) for r, n in zip(episode_returns, episode_lengths, strict=True)
        )

    def add_foreign(self, batch: LearnerTransitions, *, credit: float = 1.0) -> None:
        """Other participants' transitions, into the learner's one replay beside local ones.

        Each earns `credit` times a local env step's replay-ratio credit:
        with 1, every transition in the replay gets the same expected number
        of replays whoever collected it, and the updates grow with all the
        data received (Ape-X's learner, across a federation). Checked like a
        local batch; DQN only (PPO learns from its own rollouts).
        """
        if not isinstance(self.learner, Learner):
            raise TypeError("foreign transitions are off-policy data: only DQN learns from them")
        if not credit >= 0.0:
            raise ValueError(f"credit must be >= 0, got {credit}")
        self.learner.add(batch, foreign=True)
        self.foreign_received += len(batch)
        if self._ledger is not None:
            # Every rank must owe the same updates (each is a collective): the
            # credit joins theirs at the next exchange. The transitions stay in
            # this rank's shard.
            self._ledger.hold_foreign(credit * len(batch))
        else:
            self._foreign_credit += credit * len(batch)

    # -- learner ranks -------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """A stop was requested; as one rank of several, every rank has agreed to it."""
        return self._stopping

    def request_stop(self) -> None:
        """Stop at the next round (for a rank: every rank stops after the next exchange).

        Safe from a signal handler: it only sets a flag.
        """
        self._stop_requested = True
        if self._ranks is None:
            self._stopping = True

    def _rollouts_complete(self) -> bool:
        """PPO: every actor's rollout is here (as one rank: at every rank, as of the exchange)."""
        if self._ranks is not None:
            return self._all_ready
        return len(self._rollouts) == len(self._actors)

    def _exchange(self) -> RoundOutcome:
        """One round among the ranks: counts, readiness, stop requests, rank 0's new state.

        Returns the round, whose counts the caller adds once the poll is through.
        """
        assert self._ranks is not None and self._ledger is not None
        if isinstance(self.learner, PPOLearner):
            ready = self._serial is not None or len(self._rollouts) == len(self._actors)
        else:
            ready = self.learner.ready()
        row = self._ledger.row(ready=ready, stop=self._stop_requested, changed=self._state_changed)
        outcome = outcome_of(self._ranks.exchange(row))
        self._all_ready = outcome.all_ready
        self._stopping = self._stopping or outcome.stop
        if outcome.state_changed:
            self._share_state()
        return outcome

    def _share_state(self) -> None:
        """Rank 0's learner, counters and hyperparameters on every rank (a collective)."""
        assert self._ranks is not None
        leads = self._ranks.leads
        state = self._ranks.broadcast_state(
            {
                "learner": self.learner.state_dict(),
                "counters": dataclasses.asdict(self.counters),
                "hyperparameters": dict(self.hyperparameters()),
            }
            if leads
            else None
        )
        if not leads:
            self.learner.load_state_dict(state["learner"])
            counters = dict(state["counters"])
            counters["recent_returns"] = tuple(counters["recent_returns"])
            self.restore_counters(Counters(**counters))
            self.set_hyperparameters(state["hyperparameters"])
        self._state_changed = False
        if self._started and (self._board is not None or self._serial is not None):
            self._publish()

    # -- hyperparameters (population-based training) ------------------------

    def hyperparameters(self) -> Hyperparameters:
        """The values population-based training may change, by their wire names."""
        return read_hyperparameters(self.config, self.learner.config)

    def set_hyperparameters(self, values: Hyperparameters) -> None:
        """Take new hyperparameters; actors restart where theirs changed (DQN: ε, n-step γ).

        Transitions already in the replay keep the discount they were
        collected with; the replay turns over within replay_capacity steps.
        """
        engine_config, learner_config = with_hyperparameters(
            self.config, self.learner.config, values
        )
        restart = self._started and actors_need_restart(
            self.config, self.learner.config, engine_config, learner_config
        )
        if isinstance(self.learner, PPOLearner):
            assert isinstance(learner_config, PPOConfig)
            self.learner.reconfigure(learner_config)
        else:
            assert isinstance(learner_config, LearnerConfig)
            self.learner.reconfigure(learner_config)
        self.config = engine_config
        self._state_changed = True
        if restart:
            self._restart_actors()

    def _restart_actors(self) -> None:
        """New actors with the current specs; what the old ones held is dropped."""
        if self._serial is not None:
            self._serial.close()
            self._serial_generation += 1
            self._serial = self._serial_actor(self._serial_generation)
        for position, actor in enumerate(self._actors):
            actor.process.kill()
            actor.process.join(timeout=5.0)
            # A fresh seed stream, as after a restart; the failure budget is untouched.
            self._replace_actor(position, restarts=actor.restarts)
        self._publish()

    def on_batch(self, hook: Callable[[LearnerTransitions], None]) -> None:
        """Call `hook` with every local batch the learner takes in, after it was validated."""
        self._batch_hooks.append(hook)

    def _receive(self, timeout_s: float) -> list[tuple[_ActorHandle, SlotFill]]:
        """Every slot announced within the timeout, with the actor that filled it."""
        by_conn = {a.filled_slots: a for a in self._actors}
        received = []
        for conn in wait(list(by_conn), timeout=timeout_s):
            actor = by_conn[conn]  # type: ignore[index]
            try:
                message = actor.filled_slots.recv_bytes()
            except (EOFError, OSError):
                continue  # the actor is gone; _check_actors deals with it
            fill = parse_fill(message)
            if fill.slot not in actor.slots:
                raise ActorFailureError(
                    f"actor {actor.spec.index} announced slot {fill.slot}, not its own"
                )
            received.append((actor, fill))
        return received

    def _check_actors(self) -> None:
        for position, actor in enumerate(self._actors):
            code = actor.process.exitcode
            if code is None:
                continue
            cause = describe_exit(code)
            if actor.restarts >= self.config.max_actor_restarts:
                raise ActorFailureError(
                    f"actor {actor.spec.index} {cause} and was already restarted "
                    f"{actor.restarts} times (max_actor_restarts); stopping. "
                    "Its traceback, if any, is printed above."
                )
            # Whatever it finished before dying is still good experience.
            while True:
                try:
                    if not actor.filled_slots.poll(0):
                        break
                    message = actor.filled_slots.recv_bytes()
                except (EOFError, OSError):
                    break
                self._take_fill(actor, parse_fill(message))
            self._replace_actor(position, restarts=actor.restarts + 1)

    def _replace_actor(self, position: int, *, restarts: int) -> None:
        """A successor on the same slots, in the next generation, for an actor that is gone."""
        actor = self._actors[position]
        with contextlib.suppress(OSError):
            actor.free_slots.close()
            actor.filled_slots.close()
        self._actors[position] = self._spawn(
            actor.spec.index,
            actor.slots,
            generation=actor.generation + 1,
            restarts=restarts,
        )

    def _publish(self) -> None:
        weights = self.learner.weights()
        if self._board is not None:
            self._board.publish(weights)
        if self._serial is not None:
            self._serial.load_weights(weights, self.learner.updates)
        self._updates_at_publish = self.learner.updates

    def _maybe_evaluate(self) -> tuple[EvalResult | None, bool]:
        if self._evaluator is None or self._env_steps < self._next_eval:
            return None, False
        interval = self.config.eval_interval
        self._next_eval = (self._env_steps // interval + 1) * interval
        result = self.evaluate()
        new_best = self._best_eval is None or result.mean > self._best_eval
        if new_best:
            self._best_eval = result.mean
        self._last_eval = result.mean
        return result, new_best

    def evaluate(self, weights: Sequence[tuple[str, npt.NDArray[Any]]] | None = None) -> EvalResult:
        """Greedy returns of the learner's online network, or of other weights in a copy of it.

        A copy, so evaluating another model (the global one) leaves the
        learner's networks and the actors' weights untouched.
        """
        if self._evaluator is None:
            raise RuntimeError("evaluation is disabled (eval_interval=0)")
        net = self.learner.online
        if weights is not None:
            net = copy.deepcopy(net)
            load_named_arrays(net, weights)
        return self._evaluator.run_policy(greedy_policy(net))

    def scorer(self, episodes: int) -> Scorer:
        """A greedy evaluator of other weights for another thread: its own envs, seeds and a
        CPU copy of the network, so scoring never touches the learner, its device, the
        actors or the engine's own evaluation envs (and so never changes what training does)."""
        (seed,) = self._seeds.spawn(1)
        evaluator = Evaluator(
            self.config.env,
            data=self.config.data,
            episodes=episodes,
            seed=seed,
            max_steps=self.config.eval_max_steps,
            window=self._network.window,
        )
        return Scorer(copy.deepcopy(self.learner.online).to("cpu"), evaluator)

    # -- hooks for the sync loop and autosave --------------------------------

    def actor_pids(self) -> list[int]:
        """Process ids of the live actor processes (empty in serial mode)."""
        return [a.process.pid for a in self._actors if a.process.pid is not None]

    @property
    def counters(self) -> Counters:
        return Counters(
            episodes=self._episodes,
            env_steps=self._env_steps,
            updates=self.learner.updates,
            best_eval=self._best_eval,
            last_eval=self._last_eval,
            recent_returns=tuple(self._recent),
        )

    def restore_counters(self, counters: Counters) -> None:
        """Continue from saved counters (resume). The learner's own state is restored separately."""
        self._episodes = counters.episodes
        self._env_steps = counters.env_steps
        self._best_eval = counters.best_eval
        self._last_eval = counters.last_eval
        self._recent.clear()
        self._recent.extend(counters.recent_returns)
        self._state_changed = True
        interval = self.config.eval_interval
        if interval:
            self._next_eval = (counters.env_steps // interval + 1) * interval

    def weights(self) -> list[tuple[str, npt.NDArray[Any]]]:
        return self.learner.weights()

    def set_weights(
        self,
        arrays: Sequence[tuple[str, npt.NDArray[Any]]],
        *,
        target: TargetAtAdoption = "reset",
    ) -> None:
        """Adopt a model (e.g. the global one) and hand it to the actors at once.

        `target` is the DQN target network's fate (Learner.set_weights); PPO has none.
        As rank 0 of several, the other ranks take it at the next exchange.
        """
        self._state_changed = True
        if isinstance(self.learner, PPOLearner):
            self.learner.set_weights(arrays)
        else:
            self.learner.set_weights(arrays, target=target)
        if self._started:
            self._publish()

    def adopt(
        self, arrays: Sequence[tuple[str, npt.NDArray[Any]]], *, target: TargetAtAdoption
    ) -> None:
        """Adopt a global model during training.

        DQN's actors get it with the next regular publish (at most
        weights_interval updates later), as they get every other change of the
        learner: adopting changes what the actors play no sooner than training
        would, so a lone participant's run stays the run it would be offline.
        PPO's actors get it at once: a rollout must come from the policy it
        updates. So do the actors of an engine that does not learn: it never
        publishes otherwise. (As rank 0 of several learners, every rank's
        actors get it when the ranks share rank 0's new state, at the next
        exchange.)
        """
        if isinstance(self.learner, PPOLearner) or not self.learns:
            self.set_weights(arrays, target=target)
        else:
            # As rank 0 of several, the other ranks take it at the next exchange.
            self._state_changed = True
            self.learner.set_weights(arrays, target=target)


def _seed_of(seed: np.random.SeedSequence) -> int:
    return int(seed.generate_state(1)[0])


def describe_exit(code: int) -> str:
    """An exit code as people say it: "was killed by SIGKILL", "exited with code 1"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
