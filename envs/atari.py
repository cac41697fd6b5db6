"""Atari games by id (`ALE/Breakout-v5`), preprocessed by ale-py's native vector env.

The standard preprocessing of Mnih et al. (2015) and Machado et al. (2018),
done in C++ threads by `ale_py.vector_env.AtariVectorEnv`: up to 30 no-op
actions at reset (and FIRE where the game needs it to start), each action
repeated for 4 frames with the last two max-pooled (flicker), 84×84
greyscale, the newest 4 frames stacked into uint8 [4, 84, 84], and the
`-v5` ids' sticky actions (25 %) and 108,000-frame time limit. Stepping the
same games through Gymnasium's wrappers one env at a time is slower
(bench/atari_collection.py), and needs OpenCV.

What the env does not do is deliberately left to the actors: rewards come
out raw (the score, which progress, evaluation and the server see; actors
clip their sign for training) and a lost life ends no episode (actors that
want episodic life read `info["lives"]` and cut the n-step return there,
while the game, its stack of frames and its score go on).

A stack after a reset is [0, 0, 0, f0], then [0, 0, f0, f1] and so on: the
missing history is zeros, which is what the frame replay
(fedrl.client.training.frame_replay) rebuilds stacks with.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

ALE_PREFIX = "ALE/"
FRAME_STACK = 4
"""Frames per observation."""
FRAME_SIZE = 84
"""Height and width of a preprocessed frame."""
NOOP_MAX = 30
INSTALL_HINT = "Atari games need ale-py: pip install 'fedrl[atari]' (or: pip install ale-py)"


def is_atari(env_id: str) -> bool:
    """Whether `env_id` names an ALE game (`ALE/<Game>-v5`), made by `make_atari_vector_env`."""
    return env_id.startswith(ALE_PREFIX)


def is_atari_vector_env(env: gym.vector.VectorEnv) -> bool:
    """Whether `env` (or what it wraps) is ale-py's vector env, which takes one seed per env."""
    return type(env.unwrapped).__name__ == "AtariVectorEnv"


def _ale_py() -> Any:
    try:
        module = importlib.import_module("ale_py")
    except ImportError as exc:
        raise ValueError(INSTALL_HINT) from exc
    # Registers the ALE/* ids with Gymnasium (a no-op when already registered).
    gym.register_envs(module)
    return module


def make_atari_vector_env(
    env_id: str, num_envs: int, *, threads: int = 1, render: bool = False
) -> gym.vector.VectorEnv:
    """`num_envs` preprocessed copies of the game `env_id`, stepped as one batch.

    `threads`: the ALE's own worker threads. An actor process keeps its one
    core busy with inference between steps, so one thread each is the default.
    `render`: `render()` returns each env's full-size colour screen.
    """
    _ale_py()
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"unknown Atari game {env_id!r}: {exc}") from exc
    env: gym.vector.VectorEnv = gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **_options(threads)
    )
    if render:
        env = RenderedAtariVectorEnv(env, env_id, threads)
    return env


def _options(threads: int) -> dict[str, Any]:
    return {
        "num_threads": threads,
        "img_height": FRAME_SIZE,
        "img_width": FRAME_SIZE,
        "grayscale": True,
        "stack_num": FRAME_STACK,
        "maxpool": True,
        "noop_max": NOOP_MAX,
        "reward_clipping": False,
        "episodic_life": False,
        "life_loss_info": False,
        "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP,
    }


class RenderedAtariVectorEnv(gym.vector.VectorWrapper):
    """An Atari vector env whose `render()` is each env's colour screen, 210×160.

    The preprocessed env shows the agent only greyscale 84×84 stacks, so a
    twin env plays alongside, seeded alike and given the same actions: the
    emulator is deterministic given its seed (sticky actions and no-ops
    included), so the twin's full-size colour screens are the frames of the
    very game the agent plays. A check on every step (rewards, ends and
    frame numbers agree) makes a divergence an error rather than a wrong video.
    """

    def __init__(self, env: gym.vector.VectorEnv, env_id: str, threads: int) -> None:
        super().__init__(env)
        options = _options(threads) | {
            "img_height": 210,
            "img_width": 160,
            "grayscale": False,
            "stack_num": 1,
            "maxpool": False,
        }
        self._twin: gym.vector.VectorEnv = gym.make_vec(
            env_id, num_envs=env.num_envs, vectorization_mode="vector_entry_point", **options
        )
        self._screens: npt.NDArray[np.uint8] | None = None
        self.metadata = {**env.metadata, "render_modes": ["rgb_array"]}

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        screens, twin_info = self._twin.reset(seed=seed, options=options)
        self._agree(info, twin_info)
        self._screens = np.asarray(screens)[:, -1]
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        screens, twin_reward, *_, twin_info = self._twin.step(actions)
        if not np.array_equal(reward, twin_reward):
            raise RuntimeError("the rendering twin of the Atari env diverged from the game")
        self._agree(info, twin_info)
        self._screens = np.asarray(screens)[:, -1]
        return obs, reward, terminated, truncated, info

    @staticmethod
    def _agree(info: dict[str, Any], twin_info: dict[str, Any]) -> None:
        for key in ("lives", "episode_frame_number"):
            if not np.array_equal(np.asarray(info.get(key)), np.asarray(twin_info.get(key))):
                raise RuntimeError("the rendering twin of the Atari env diverged from the game")

    def render(self) -> tuple[npt.NDArray[np.uint8], ...]:
        if self._screens is None:
            raise RuntimeError("reset the env before rendering it")
        return tuple(self._screens)

    def close(self, **kwargs: Any) -> None:
        self._twin.close()
        super().close(**kwargs)


def lives(info: dict[str, Any], num_envs: int) -> npt.NDArray[np.int64]:
    """Lives left in each env's game, from a step's info (zeros where the game has none)."""
    found = info.get("lives")
    if found is None:
        return np.zeros(num_envs, dtype=np.int64)
    return np.asarray(found, dtype=np.int64)
