"""The off-policy schedule (DQN): actors stream transitions into the replay, the learner trains
at the replay ratio, asynchronously.

Actors hand over n-step transitions (or, on Atari's frame stacks, single
frames the replay keeps once) through shared-memory slots. Every round the
learner first does the updates it owes: the replay ratio times the env steps
since its replay became ready, foreign transitions credited as local steps
(`add_foreign`). Only then is new experience taken in, so a learner that
falls behind holds the actors back through their bounded slots instead of
letting the effective replay ratio drift with machine load.

Everything that reaches the replay passes `_write_transitions` or
`_write_frames` (local experience) or `add_foreign` (other participants').
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fedrl.client.training.actor import ActorCore, ActorSpec, make_actor_spec, slot_capacity
from fedrl.client.training.actor_pool import ActorHandle
from fedrl.client.training.counters import Tally
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.frame_slots import FrameLayout, FrameSlot, SlotLayout
from fedrl.client.training.learner import Learner, PendingWeights
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.schedule import Schedule
from fedrl.client.training.shm import RingLayout, SlotFill, TransitionSlot
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import observation_dtype

MAX_UPDATES_PER_ROUND = 64
"""Updates one parallel round may do before it looks at the actors' slots again."""


class ReplaySchedule(Schedule[Learner]):
    """DQN: train what the replay ratio allows, take in new transitions, publish every so often."""

    def __init__(
        self,
        learner: Learner,
        *,
        config: EngineConfig,
        network: NetworkConfig,
        seed_root: np.random.SeedSequence,
        tally: Tally,
        frames: bool,
        learns: bool,
        world_size: int,
    ) -> None:
        """`frames`: actors hand over single frames (Atari's stacks); `learns=False`: the batches
        only reach the on_batch hooks (an acting-only participant); `world_size`: learner
        ranks stepping together."""
        super().__init__(learner, config=config, network=network, seed_root=seed_root, tally=tally)
        self.frames = frames
        self.learns = learns
        self._world_size = world_size
        self._hooks: list[Callable[[LearnerTransitions], None]] = []
        self.foreign_received = 0
        """Other participants' transitions taken in (add_foreign), this run."""
        # Replay-ratio credit counts from the moment the replay is ready, so
        # the first update does not face a backlog of learning_starts·ratio.
        self._steps_when_ready: int | None = None
        self._updates_when_ready = 0
        self._foreign_credit_when_ready = 0.0
        self._weights_on_their_way: PendingWeights | None = None

    # -- the actors ----------------------------------------------------------------

    def in_process(self, workers: int) -> bool:
        return workers == 0

    @property
    def slots_per_actor(self) -> int:
        return self.config.slots_per_worker

    def actor_spec(
        self, index: int, num_actors: int, generation: int
    ) -> ActorSpec | FrameActorSpec:
        c, learner = self.config, self.learner.config
        spec = make_actor_spec(
            index,
            num_actors=num_actors,
            generation=generation,
            seed_root=self._seed_root,
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
            opponents=self.opponents,
        )
        if self.frames:
            return FrameActorSpec(
                actor=spec, clip_rewards=c.clip_rewards, episodic_life=c.episodic_life
            )
        return spec

    def ring_layout(self, workers: int) -> SlotLayout:
        c, per_actor = self.config, self.slots_per_actor
        obs_shape = self.learner.obs_shape
        if self.frames:
            return FrameLayout(
                num_slots=workers * per_actor,
                steps=c.steps_per_slot,
                envs=c.envs_per_worker,
                frame_shape=obs_shape[1:],
                n_step=c.n_step,
            )
        rows, episodes = slot_capacity(c.envs_per_worker, c.steps_per_slot, c.n_step)
        return RingLayout(
            num_slots=workers * per_actor,
            rows_per_slot=rows,
            episodes_per_slot=episodes,
            obs_shape=obs_shape,
            obs_dtype=np.dtype(observation_dtype(obs_shape)).name,
        )

    # -- the round -------------------------------------------------------------------

    def ready(self) -> bool:
        return self.learner.ready()

    @property
    def learning_started(self) -> bool:
        """Whether the learner has begun updating, its replay (foreign transitions included)
        having reached learning_starts on every rank."""
        return self._steps_when_ready is not None

    def poll(self, timeout_s: float, *, ranks_ready: bool | None) -> dict[str, float]:
        metrics: dict[str, float] = {}
        owed = self._owed_updates(self.ready() if ranks_ready is None else ranks_ready)
        serial = self.pool.serial
        if owed > 0:
            metrics = self.learner.train(owed if serial else min(owed, MAX_UPDATES_PER_ROUND))
        if isinstance(serial, ActorCore):
            got = serial.collect(self.config.steps_per_slot)
            self._write_transitions(
                got.batch,
                got.env_steps,
                got.episode_returns,
                got.episode_lengths,
                got.episode_opponents,
            )
        elif isinstance(serial, FrameActorCore):
            frames = serial.collect(self.config.steps_per_slot)
            self._write_frames(
                0, frames.segment, frames.env_steps, frames.episode_returns, frames.episode_lengths
            )
        elif owed <= 0:
            for actor, fill in self.pool.receive(timeout_s):
                self.take_fill(actor, fill)
        self._publish_when_due()
        return metrics

    def _publish_when_due(self) -> None:
        """The learner's weights to the actors every weights_interval updates.

        A learner whose updates run on the device copies its weights out
        behind the updates it has queued, and they reach the actors at the
        first round after they arrive: publishing never waits for the GPU.
        """
        due = self.learner.updates - self.published_at >= self.config.weights_interval
        if due and self._weights_on_their_way is None:
            if not self.learner.on_device:
                self.publish()
                return
            self._weights_on_their_way = self.learner.weights_later()
        pending = self._weights_on_their_way
        if pending is not None and pending.arrived():
            self._weights_on_their_way = None
            self.pool.publish(pending.arrays, pending.updates)
            self.published_at = pending.updates

    def publish(self) -> None:
        """Hand the learner's weights to the actors now; weights still on their way are
        older, and are dropped."""
        self._weights_on_their_way = None
        super().publish()

    def set_config(self, config: EngineConfig) -> None:
        """Take the engine's new config; a new replay ratio counts its credit from now on."""
        if config.replay_ratio != self.config.replay_ratio:
            self.restart_credit()
        super().set_config(config)

    def restart_credit(self) -> None:
        """Count replay-ratio credit from now: after a new ratio, or after the learner took
        another's state (population-based training), whose update count is not the one this
        schedule has been paying off. Without it, the updates the copy brought would stand
        as a debt the learner sits out, or a ratio change would apply to all past steps."""
        if self._steps_when_ready is None:
            return
        self._steps_when_ready = self._tally.env_steps
        self._updates_when_ready = self.learner.updates
        self._foreign_credit_when_ready = self._tally.foreign_credit

    def _owed_updates(self, ready: bool) -> int:
        if not self.learns or not ready:
            return 0
        tally = self._tally
        if self._steps_when_ready is None:
            self._steps_when_ready = tally.env_steps
            self._updates_when_ready = self.learner.updates
            self._foreign_credit_when_ready = tally.foreign_credit
        # N ranks step together on N batches, so an update per N env steps of
        # theirs (foreign transitions included) keeps each transition's
        # expected reuse at the replay ratio.
        own = tally.env_steps - self._steps_when_ready
        steps = own + (tally.foreign_credit - self._foreign_credit_when_ready)
        if own > 0:
            self.learner.set_data_multiple(max(1.0, steps / own))
        credit = math.floor(self.config.replay_ratio * steps / self._world_size)
        return credit - (self.learner.updates - self._updates_when_ready)

    # -- the replay-writing path -------------------------------------------------------

    def on_batch(self, hook: Callable[[LearnerTransitions], None]) -> None:
        """Call `hook` with every local batch the learner takes in, after it was validated."""
        self._hooks.append(hook)

    def take_fill(self, actor: ActorHandle, fill: SlotFill) -> None:
        """Copy an announced slot out, hand it straight back, and write what it held."""
        assert self.pool.ring is not None
        slot = self.pool.ring.slots[fill.slot]
        if isinstance(slot, FrameSlot):
            segment, returns, lengths = slot.read(fill)
            self.pool.free(actor.spec.index, fill.slot)
            self._write_frames(actor.spec.index, segment, fill.env_steps, returns, lengths)
            return
        assert isinstance(slot, TransitionSlot)
        batch, returns, lengths = slot.read(fill)
        opponents = slot.opponents(fill)
        self.pool.free(actor.spec.index, fill.slot)
        self._write_transitions(batch, fill.env_steps, returns, lengths, opponents)

    def _write_transitions(
        self,
        batch: LearnerTransitions,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
        episode_opponents: npt.NDArray[np.int64],
    ) -> None:
        """An actor's transitions into the replay (checked there), then to the hooks."""
        if len(batch):
            if self.learns:
                self.learner.add(batch)
            else:
                # Checked as the replay would check it: hooks get only valid rows.
                batch.validate(self.learner.obs_shape)
            for hook in self._hooks:
                hook(batch)
        self._tally.count(env_steps, episode_returns, episode_lengths, episode_opponents)

    def _write_frames(
        self,
        actor_index: int,
        segment: FrameSegment,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        """An actor's frames into the replay: its env j is stream index·E + j there."""
        streams = actor_index * segment.envs + np.arange(segment.envs)
        stored = self.learner.add_frames(streams, segment, rebuild=bool(self._hooks))
        if stored is not None and len(stored):
            for hook in self._hooks:
                hook(stored)
        self._tally.count(env_steps, episode_returns, episode_lengths)

    def add_foreign(self, batch: LearnerTransitions, *, credit: float) -> None:
        """Other participants' transitions into the replay, each worth `credit` local env steps
        of replay-ratio credit (TrainingEngine.add_foreign)."""
        if not credit >= 0.0:
            raise ValueError(f"credit must be >= 0, got {credit}")
        self.learner.add(batch, foreign=True)
        self.foreign_received += len(batch)
        self._tally.credit_foreign(credit * len(batch))
