"""A scripted game for frame tests: random frames, stacked and reset the way the ALE's env does.

Registered as `fedrl-test/Frames-v0` (a vector entry point, so make_vector_env
and the frame actors make it by id). Like fedrl.envs.atari's env it stacks
the last k frames with zeros before a game's first, autoresets on the next
step, reports `info["lives"]`, and rewards, lost lives, game overs and time
limits come at random; some frames are all zeros, as a black screen is.
Every step is logged with the stacks the actions were taken on, so a test
can build the transitions a naive store would hold. Below it, what frame
tests share: an actor on this game, and transitions as comparable keys.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from fedrl.client.training.actor import make_actor_spec
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.transitions import LearnerTransitions

ENV_ID = "fedrl-test/Frames-v0"
STACK, HEIGHT, WIDTH, LIVES = 4, 36, 38, 3
OBS_SHAPE = (STACK, HEIGHT, WIDTH)
GAMMA = 0.9


@dataclass(frozen=True)
class LoggedStep:
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lives: np.ndarray


class ScriptedFrameEnv(gym.vector.VectorEnv):
    """`num_envs` scripted games; `log` holds every step since the last reset."""

    def __init__(
        self,
        num_envs: int,
        *,
        p_life: float = 0.15,
        p_end: float = 0.05,
        p_truncate: float = 0.04,
        p_black: float = 0.1,
    ) -> None:
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(
            0, 255, (STACK, HEIGHT, WIDTH), dtype=np.uint8
        )
        self.single_action_space = gym.spaces.Discrete(3)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self._p = (p_life, p_end, p_truncate, p_black)
        self._rng = np.random.default_rng(0)
        self._stacks = np.zeros((num_envs, STACK, HEIGHT, WIDTH), dtype=np.uint8)
        self._lives = np.full(num_envs, LIVES)
        self._resetting = np.zeros(num_envs, dtype=np.bool_)
        self.log: list[LoggedStep] = []

    def _frame(self) -> np.ndarray:
        if self._rng.random() < self._p[3]:
            return np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
        return self._rng.integers(0, 256, (HEIGHT, WIDTH), dtype=np.uint8)

    def _start(self, env: int) -> None:
        self._stacks[env] = 0
        self._stacks[env, -1] = self._frame()
        self._lives[env] = LIVES

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        self._rng = np.random.default_rng(seed)
        for env in range(self.num_envs):
            self._start(env)
        self._resetting[:] = False
        self.log = []
        return self._stacks.copy(), {"lives": self._lives.copy()}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        p_life, p_end, p_truncate, _ = self._p
        acted_on = self._stacks.copy()
        n = self.num_envs
        reward = np.zeros(n)
        terminated = np.zeros(n, dtype=np.bool_)
        truncated = np.zeros(n, dtype=np.bool_)
        for env in range(n):
            if self._resetting[env]:
                self._start(env)
                continue
            reward[env] = float(self._rng.integers(-2, 4))
            if self._rng.random() < p_life:
                self._lives[env] -= 1
            terminated[env] = self._lives[env] == 0 or self._rng.random() < p_end
            truncated[env] = not terminated[env] and self._rng.random() < p_truncate
            self._stacks[env, :-1] = self._stacks[env, 1:]
            self._stacks[env, -1] = self._frame()
        self._resetting = terminated | truncated
        self.log.append(
            LoggedStep(
                acted_on,
                np.asarray(actions).copy(),
                reward,
                terminated,
                truncated,
                self._lives.copy(),
            )
        )
        return self._stacks.copy(), reward, terminated, truncated, {"lives": self._lives.copy()}


def register() -> None:
    """Make `ENV_ID` known to Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, vector_entry_point=f"{__name__}:ScriptedFrameEnv")


def frame_actor(
    *, envs: int, n_step: int, steps: int, seed: int, clip: bool, episodic_life: bool
) -> FrameActorCore:
    """A frame actor on the scripted game (its env keeps the log)."""
    register()
    spec = make_actor_spec(
        0,
        num_actors=1,
        generation=0,
        seed_root=np.random.SeedSequence(seed),
        env_id=ENV_ID,
        num_envs=envs,
        exploration_base=0.5,
        exploration_alpha=1.0,
        n_step=n_step,
        gamma=GAMMA,
        hidden=(8,),
        dueling=False,
        steps_per_slot=steps,
    )
    return FrameActorCore(FrameActorSpec(spec, clip_rewards=clip, episodic_life=episodic_life))


def keys(batch: LearnerTransitions) -> Counter[tuple[bytes, int, float, bytes, float]]:
    """The transitions as a multiset of (obs, action, reward, next_obs, discount)."""
    return Counter(
        (o.tobytes(), int(a), float(r), x.tobytes(), float(d))
        for o, a, r, x, d in zip(
            batch.obs, batch.action, batch.reward, batch.next_obs, batch.discount, strict=True
        )
    )


def collect(
    actor: FrameActorCore, replay: FrameReplay, segments: int, steps: int
) -> LearnerTransitions:
    """`segments` segments of the actor into the replay; the transitions stored, rebuilt."""
    stored = [
        replay.add_frames(np.arange(actor.num_envs), actor.collect(steps).segment)
        for _ in range(segments)
    ]
    return replay.transitions(np.concatenate(stored))
