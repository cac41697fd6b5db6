"""Actors: E envs stepped as one batch, ε-greedy on a CPU copy of the Q-network.

`ActorCore` is the whole collection logic and runs as is in the learner's
process for `--workers 0`; `actor_process` wraps it, or PPO's
`PPOActorCore` (fedrl.client.training.ppo_actor), for a spawned process that
exchanges slots over shared memory.
"""

from __future__ import annotations

import os
import signal
import struct
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from fedrl.client.training.exploration import actor_epsilons, epsilon_greedy
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.frame_slots import SlotLayout
from fedrl.client.training.masking import legal_actions
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.nstep import NStepAccumulator
from fedrl.client.training.opponent_pool import (
    OpponentsSpec,
    attach_opponents,
    finished_opponents,
)
from fedrl.client.training.ppo_actor import PPOActorCore, PPOActorSpec
from fedrl.client.training.q_network import DEFAULT_NETWORK, build_q_network
from fedrl.client.training.shm import BoardLayout, SlotFill, SlotRing, TransitionSlot, WeightsBoard
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import (
    as_observations,
    env_shape,
    make_vector_env,
    observation_dtype,
    reset_seeded,
)
from fedrl.client.training.weights_follower import WeightsFollower

# Slot fill messages: (slot, rows, episodes, env_steps), fixed size and far
# below PIPE_BUF, so a write is atomic even if the actor is killed mid-send.
FILL_FORMAT = struct.Struct("<qqqq")
SLOT_FORMAT = struct.Struct("<q")


@dataclass(frozen=True)
class ActorSpec:
    """Everything one actor needs, in plain values (it crosses the spawn boundary)."""

    index: int
    env_id: str
    data: str | None
    num_envs: int
    epsilons: tuple[float, ...]
    seed_entropy: int
    seed_spawn_key: tuple[int, ...]
    n_step: int
    gamma: float
    hidden: tuple[int, ...]
    dueling: bool
    steps_per_slot: int
    network: NetworkConfig = DEFAULT_NETWORK
    opponents: OpponentsSpec | None = None
    """Two-player games: the league's board the opponents are drawn from."""


def make_actor_spec(
    index: int,
    *,
    num_actors: int,
    generation: int,
    seed_root: np.random.SeedSequence,
    env_id: str,
    data: str | None = None,
    num_envs: int,
    exploration_base: float,
    exploration_alpha: float,
    n_step: int,
    gamma: float,
    hidden: tuple[int, ...],
    dueling: bool,
    steps_per_slot: int,
    network: NetworkConfig = DEFAULT_NETWORK,
    opponents: OpponentsSpec | None = None,
) -> ActorSpec:
    """Actor `index` of `num_actors`, in its `generation`-th life (0 until a restart)."""
    epsilons = actor_epsilons(
        index, num_actors, num_envs, base=exploration_base, alpha=exploration_alpha
    )
    entropy = seed_root.entropy
    if not isinstance(entropy, int):
        raise TypeError("the actors' seed root needs integer entropy")
    return ActorSpec(
        index=index,
        env_id=env_id,
        data=data,
        num_envs=num_envs,
        epsilons=tuple(float(e) for e in epsilons),
        seed_entropy=entropy,
        # Children of the root by (actor, life): a restarted actor continues on
        # a fresh stream, since replaying its predecessor's episodes adds nothing.
        seed_spawn_key=(*seed_root.spawn_key, index, generation),
        n_step=n_step,
        gamma=gamma,
        hidden=hidden,
        dueling=dueling,
        steps_per_slot=steps_per_slot,
        network=network,
        opponents=opponents,
    )


@dataclass(frozen=True)
class Collected:
    """One collection round: its transitions and what else happened."""

    batch: LearnerTransitions
    env_steps: int
    episode_returns: npt.NDArray[np.float64]
    episode_lengths: npt.NDArray[np.int64]
    episode_opponents: npt.NDArray[np.int64]
    """Two-player games: each ended episode's opponent id (NO_OPPONENT elsewhere)."""


class ActorCore(WeightsFollower[nn.Module]):
    """Collects n-step transitions from one env batch with per-env exploration rates."""

    def __init__(self, spec: ActorSpec) -> None:
        if len(spec.epsilons) != spec.num_envs:
            raise ValueError(
                f"{spec.num_envs} envs need as many epsilons, got {len(spec.epsilons)}"
            )
        self._spec = spec
        seeds = np.random.SeedSequence(spec.seed_entropy, spawn_key=spec.seed_spawn_key)
        env_seeds, action_seeds, torch_seed = seeds.spawn(3)
        self._env = make_vector_env(
            spec.env_id, spec.num_envs, spec.data, window=spec.network.window
        )
        shape = env_shape(self._env)
        self.obs_shape, self.n_actions = shape.obs_shape, shape.n_actions
        self._masked = shape.action_mask
        self._rng = np.random.default_rng(action_seeds)
        torch.manual_seed(int(torch_seed.generate_state(1)[0]))

        def q_network() -> nn.Module:
            return build_q_network(
                self.obs_shape,
                self.n_actions,
                hidden=spec.hidden,
                dueling=spec.dueling,
                network=spec.network,
                action_mask=shape.action_mask,
            )

        self._net = q_network()
        self._net.eval()
        self._opponents = attach_opponents(
            self._env, spec.opponents, latest=self._net, make_net=q_network
        )
        self._eps = np.asarray(spec.epsilons, dtype=np.float64)
        self._nstep = NStepAccumulator(
            num_envs=spec.num_envs,
            obs_shape=self.obs_shape,
            n_step=spec.n_step,
            gamma=spec.gamma,
            obs_dtype=observation_dtype(self.obs_shape),
        )
        self._obs = reset_seeded(self._env, env_seeds)

    def act(self, obs: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
        """ε-greedy with each env's own ε, from one batched forward pass (legal actions only,
        where the observations carry a mask)."""
        with torch.inference_mode():
            greedy = self._net(torch.from_numpy(obs)).argmax(dim=1).numpy()
        legal = legal_actions(obs, self.n_actions) if self._masked else None
        return epsilon_greedy(greedy, self._eps, self.n_actions, self._rng, legal)

    def collect(self, vector_steps: int) -> Collected:
        batches: list[LearnerTransitions] = []
        returns: list[npt.NDArray[np.float64]] = []
        lengths: list[npt.NDArray[np.int64]] = []
        opponents: list[npt.NDArray[np.int64]] = []
        env_steps = 0
        for _ in range(vector_steps):
            obs = self._obs
            action = self.act(obs)
            next_obs, reward, terminated, truncated, info = self._env.step(action)
            next_obs = as_observations(next_obs)
            ended = np.asarray(terminated, dtype=np.bool_) | np.asarray(truncated, dtype=np.bool_)
            batch, stats = self._nstep.push(
                obs=obs,
                action=action,
                reward=np.asarray(reward),
                next_obs=next_obs,
                terminated=np.asarray(terminated, dtype=np.bool_),
                truncated=np.asarray(truncated, dtype=np.bool_),
                opponent=info.get("opponent"),
            )
            batches.append(batch)
            returns.append(stats.episode_returns)
            lengths.append(stats.episode_lengths)
            opponents.append(finished_opponents(info, ended, len(stats.episode_returns)))
            env_steps += stats.env_steps
            self._obs = next_obs
        return Collected(
            batch=LearnerTransitions.concat(batches),
            env_steps=env_steps,
            episode_returns=np.concatenate(returns),
            episode_lengths=np.concatenate(lengths),
            episode_opponents=np.concatenate(opponents),
        )

    def fill(self, slot: TransitionSlot) -> tuple[int, int, int]:
        """Collect into a shared-memory slot; (rows, episodes, env steps) for the fill message."""
        got = self.collect(self._spec.steps_per_slot)
        slot.write(
            got.batch, got.episode_returns, got.episode_lengths, opponents=got.episode_opponents
        )
        return len(got.batch), len(got.episode_returns), got.env_steps

    def close(self) -> None:
        if self._opponents is not None:
            self._opponents.close()
        self._env.close()


def slot_capacity(num_envs: int, steps_per_slot: int, n_step: int) -> tuple[int, int]:
    """Rows and episodes one slot must hold for `steps_per_slot` vector steps.

    Each env step emits its own row once, and a slot can also receive the
    up to n−1 rows per env still pending from earlier slots; an episode needs
    at least two vector steps (its last step and the reset step), except the
    first one, which may end on the slot's first step.
    """
    rows = num_envs * (steps_per_slot + n_step - 1)
    episodes = num_envs * (steps_per_slot // 2 + 1)
    return rows, episodes


def actor_process(
    *,
    spec: ActorSpec | PPOActorSpec | FrameActorSpec,
    ring_name: str,
    ring_layout: SlotLayout,
    board_name: str,
    board_layout: BoardLayout,
    free_slots: Connection,
    filled_slots: Connection,
) -> None:
    """Entry point of a spawned actor: fill a free slot, announce it, repeat until told to stop.

    Ctrl-C reaches the whole process group; only the learner's process acts on
    it, so actors ignore SIGINT and stop when the learner says so, when their
    pipe closes, or when their parent is gone.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    parent = os.getppid()
    ring: SlotRing[Any] = SlotRing(ring_layout, name=ring_name)
    board = WeightsBoard(board_layout, name=board_name)
    core: ActorCore | PPOActorCore | FrameActorCore
    if isinstance(spec, FrameActorSpec):
        core = FrameActorCore(spec)
    elif isinstance(spec, ActorSpec):
        core = ActorCore(spec)
    else:
        core = PPOActorCore(spec)
    try:
        while not board.stop_requested:
            slot = _next_free_slot(free_slots, board, parent)
            if slot is None:
                return
            if board.version != core.weights_version:
                version, arrays = board.read()
                core.load_weights(arrays, version)
            rows, episodes, env_steps = core.fill(ring.slots[slot])
            filled_slots.send_bytes(FILL_FORMAT.pack(slot, rows, episodes, env_steps))
    except (BrokenPipeError, EOFError):
        return
    finally:
        core.close()
        ring.close()
        board.close()


def _next_free_slot(conn: Connection, board: WeightsBoard, parent: int) -> int | None:
    # Poll in short waits: a learner killed with SIGKILL sends nothing, and
    # its pipe end may stay open in a sibling, so the parent id is checked too.
    while not board.stop_requested and os.getppid() == parent:
        if conn.poll(0.2):
            (slot,) = SLOT_FORMAT.unpack(conn.recv_bytes())
            return int(slot)
    return None


def parse_fill(message: bytes) -> SlotFill:
    if len(message) != FILL_FORMAT.size:
        raise ValueError(f"slot fill message of {len(message)} bytes, expected {FILL_FORMAT.size}")
    slot, rows, episodes, env_steps = FILL_FORMAT.unpack(message)
    return SlotFill(slot=slot, rows=rows, episodes=episodes, env_steps=env_steps)
