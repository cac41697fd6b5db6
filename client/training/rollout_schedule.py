"""The on-policy schedule (PPO): a rollout from every actor, one update on all of them, publish.

Every actor collects one rollout with the newest weights, the learner takes
one update from all of them together, publishes, and only then hands the
slots back, so no step is ever collected with a policy older than the one
being improved. One actor runs in this process: collection and learning
take turns, so a process of its own would overlap with nothing.
"""

from __future__ import annotations

import numpy as np

from fedrl.client.training.actor_pool import ActorFailureError, ActorHandle
from fedrl.client.training.counters import Tally
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_actor import PPOActorCore, PPOActorSpec
from fedrl.client.training.ppo_learner import PPOLearner
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.schedule import Schedule
from fedrl.client.training.shm import RolloutLayout, RolloutSlot, SlotFill
from fedrl.envs.atari import is_atari


class RolloutSchedule(Schedule[PPOLearner]):
    """PPO: rollouts from every actor, then one update on all of them, then publish."""

    def __init__(
        self,
        learner: PPOLearner,
        *,
        config: EngineConfig,
        network: NetworkConfig,
        seed_root: np.random.SeedSequence,
        tally: Tally,
    ) -> None:
        super().__init__(learner, config=config, network=network, seed_root=seed_root, tally=tally)
        # By actor index: this round's rollouts, their slots held until the
        # update; then the slots of the last update, until the next round.
        self._rollouts: dict[int, tuple[int, Rollout]] = {}
        self._spent: dict[int, int] = {}

    # -- the actors ----------------------------------------------------------------

    def in_process(self, workers: int) -> bool:
        # One actor process would overlap with nothing: it runs in this
        # process instead, with the same seeds and so the same results, minus
        # a spawn and a copy through shared memory.
        return workers <= 1

    @property
    def slots_per_actor(self) -> int:
        # One rollout per actor per update; more slots would only let an actor
        # run ahead with weights the update is about to replace.
        return 1

    def actor_spec(self, index: int, num_actors: int, generation: int) -> PPOActorSpec:
        c = self.config
        entropy = self._seed_root.entropy
        assert isinstance(entropy, int)
        return PPOActorSpec(
            index=index,
            env_id=c.env,
            data=c.data,
            num_envs=c.envs_per_worker,
            seed_entropy=entropy,
            # As for DQN's actors: a stream per (actor, life).
            seed_spawn_key=(*self._seed_root.spawn_key, index, generation),
            steps_per_slot=self.learner.config.rollout_steps,
            hidden=self.learner.config.ppo_hidden,
            network=self._network,
            clip_rewards=c.clip_rewards and is_atari(c.env),
            opponents=self.opponents,
        )

    def ring_layout(self, workers: int) -> RolloutLayout:
        return RolloutLayout(
            num_slots=workers,
            steps=self.learner.config.rollout_steps,
            envs=self.config.envs_per_worker,
            obs_shape=self.learner.obs_shape,
            action_shape=self.learner.action_shape,
            obs_dtype=self.learner.obs_dtype.name,
            frame_stacks=is_atari(self.config.env),
        )

    # -- the round -------------------------------------------------------------------

    def ready(self) -> bool:
        """Every actor's rollout is here (always, for the one actor in this process)."""
        return self.pool.serial is not None or len(self._rollouts) == len(self.pool.actors)

    def poll(self, timeout_s: float, *, ranks_ready: bool | None) -> dict[str, float]:
        """The slots of an update go back to the actors at the start of the next round, not
        right after it: weights the caller sets in between (an adopted global model) thus
        reach every step collected after them."""
        if isinstance(self.pool.serial, PPOActorCore):
            got = self.pool.serial.collect()
            self._tally.count(
                got.env_steps, got.episode_returns, got.episode_lengths, got.episode_opponents
            )
            metrics = self.learner.train(got.rollout)
            self.publish()
            return metrics
        spent, self._spent = self._spent, {}
        for index, slot in spent.items():
            self.pool.free(index, slot)
        for actor, fill in self.pool.receive(timeout_s):
            self.take_fill(actor, fill)
        if not (self.ready() if ranks_ready is None else ranks_ready):
            return {}
        ordered = [self._rollouts[index][1] for index in sorted(self._rollouts)]
        metrics = self.learner.train(Rollout.concat(ordered))
        self.publish()
        self._spent = {index: slot for index, (slot, _) in self._rollouts.items()}
        self._rollouts = {}
        return metrics

    def take_fill(self, actor: ActorHandle, fill: SlotFill) -> None:
        """Copy an announced rollout out; its slot stays held until the update is done."""
        assert self.pool.ring is not None
        slot = self.pool.ring.slots[fill.slot]
        assert isinstance(slot, RolloutSlot)
        rollout, returns, lengths = slot.read(fill)
        if actor.spec.index in self._rollouts:
            raise ActorFailureError(f"actor {actor.spec.index} sent two rollouts for one update")
        self._rollouts[actor.spec.index] = (fill.slot, rollout)
        self._tally.count(fill.env_steps, returns, lengths, slot.opponents(fill))
