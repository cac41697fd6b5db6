"""Gymnasium vector envs by id, seeded so that no two envs share a random sequence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt

# Registers fedrl's own envs (fedrl/Trading-v0) wherever envs are made: in the
# learner's process, in spawned actors and in the evaluator alike.
import fedrl.envs  # noqa: F401
from fedrl.client.training.cnn import is_image
from fedrl.client.training.obs_window import WindowedVectorEnv
from fedrl.envs.atari import is_atari, is_atari_vector_env, make_atari_vector_env
from fedrl.envs.board_games import is_two_player
from fedrl.envs.two_player import Opponents, TwoPlayerVectorEnv


@dataclass(frozen=True)
class EnvShape:
    """What the networks and the buffers need to know about an env."""

    obs_shape: tuple[int, ...]
    n_actions: int
    """Discrete actions; 0 where the actions are a Box."""
    action_low: tuple[float, ...] = ()
    """Box actions: the lower bound of each dimension (empty for Discrete)."""
    action_high: tuple[float, ...] = ()
    """Box actions: the upper bound of each dimension (empty for Discrete)."""
    action_mask: bool = False
    """Observations end with the legal-action mask (two-player games,
    fedrl.client.training.masking)."""

    @property
    def discrete(self) -> bool:
        return self.n_actions > 0

    @property
    def action_dim(self) -> int:
        """Dimensions of a Box action; 0 for Discrete."""
        return len(self.action_low)


def make_vector_env(
    env_id: str,
    num_envs: int,
    data: str | None = None,
    *,
    window: int = 0,
    render: bool = False,
    opponents: Opponents | None = None,
) -> gym.vector.VectorEnv:
    """`num_envs` copies of `env_id` stepped as one batch, in this process.

    A native vectorised implementation (CartPole's numpy one, ~20x a
    SyncVectorEnv) is used where Gymnasium registers one. Otherwise envs run
    serially in this process: the caller is already one of several actor
    processes, and AsyncVectorEnv's per-step pipe round trips cost more than
    the envs themselves (9-12k vs 117k CartPole steps/s measured here).
    Autoreset stays Gymnasium's default NEXT_STEP, the only mode every vector
    env supports; `fedrl.client.training.nstep` handles it. `data` (a file the env reads,
    e.g. OHLCV bars) is passed only when given: most envs take no such option.
    `window` > 0 makes each observation the env's last `window` observations
    (fedrl.client.training.obs_window), for the transformer policy.
    Atari games (`ALE/...`) come preprocessed from ale-py's native vector env
    (fedrl.envs.atari). Two-player games (`pettingzoo/...`) show the learner's
    side (fedrl.envs.two_player), against `opponents` (uniform random when
    None). `render`: `render()` gives each env's rgb_array frame.
    """
    if num_envs < 1:
        raise ValueError(f"need at least one env per batch, got {num_envs}")
    if opponents is not None and not is_two_player(env_id):
        raise ValueError(f"{env_id} is no two-player game: it has no opponents")
    if is_two_player(env_id):
        if data is not None or window:
            raise ValueError(f"{env_id} takes no --data and no observation window")
        return TwoPlayerVectorEnv(env_id, num_envs, opponents=opponents, render=render)
    if is_atari(env_id):
        if data is not None or window:
            raise ValueError(f"{env_id} takes no --data and no observation window")
        return make_atari_vector_env(env_id, num_envs, render=render)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"unknown Gymnasium env id {env_id!r}: {exc}") from exc
    mode = "vector_entry_point" if spec.vector_entry_point is not None and not render else "sync"
    options: dict[str, Any] = {} if data is None else {"data": data}
    if render:
        options["render_mode"] = "rgb_array"
    try:
        env: gym.vector.VectorEnv = gym.make_vec(
            env_id, num_envs=num_envs, vectorization_mode=mode, **options
        )
    except gym.error.DependencyNotInstalled as exc:
        raise ValueError(
            f"{env_id} needs packages that are not installed: {_install_hint(spec, exc)}"
        ) from exc
    env_shape(env, continuous=True)
    if window:
        env = WindowedVectorEnv(env, window)
    return env


def _install_hint(spec: gym.envs.registration.EnvSpec, exc: Exception) -> str:
    """What to install. Gymnasium's own advice for Box2D (its box2d extra) brings pygame-ce,
    which clashes with the pygame fedrl's box2d extra pins; elsewhere its advice stands."""
    if "box2d" in str(spec.entry_point):
        return (
            "install fedrl's box2d extra: pip install 'fedrl[box2d]' "
            "(in a checkout: pip install -e '.[box2d]')"
        )
    return str(exc)


def env_shape(env: gym.vector.VectorEnv, *, continuous: bool = False) -> EnvShape:
    """Observation shape and actions, or a clear error for spaces we cannot act in.

    Box actions only with `continuous` (PPO's Gaussian policy); DQN needs Discrete.
    """
    obs_space = env.single_observation_space
    act_space = env.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"expected a Box observation space (flat or image); got {obs_space}")
    obs_shape = tuple(int(d) for d in obs_space.shape)
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvShape(
            obs_shape=obs_shape,
            n_actions=int(act_space.n),
            action_mask=bool(env.metadata.get("action_mask", False)),
        )
    if not continuous:
        raise ValueError(
            f"DQN needs a discrete action space; this env has {act_space} (use --algo ppo)"
        )
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return EnvShape(
            obs_shape=obs_shape,
            n_actions=0,
            action_low=tuple(float(v) for v in act_space.low),
            action_high=tuple(float(v) for v in act_space.high),
        )
    raise ValueError(f"expected a Discrete or a one-dimensional Box action space; got {act_space}")


def reset_seeded(env: gym.vector.VectorEnv, seeds: np.random.SeedSequence) -> npt.NDArray[Any]:
    """Reset with seeds drawn from this env batch's own seed stream.

    Sync/Async vector envs take one seed per env, and so does the ALE's
    (an array; an int would seed its envs with consecutive numbers); other
    native vector envs take one seed for their single batched generator,
    whose draws differ per env. Seeds come from a SeedSequence child, not
    `seed + i`, so that two actors with neighbouring seeds never hand the
    same seed to two envs. Observations keep their dtype (`as_observations`).
    """
    per_env = seeds.generate_state(env.num_envs, dtype=np.uint32)
    if isinstance(env.unwrapped, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv):
        # One seed per env: the wrapped Sync/AsyncVectorEnv takes a list.
        obs, _ = env.reset(seed=cast(Any, [int(s) for s in per_env]))
    elif is_atari_vector_env(env):
        # The ALE takes C ints: seeds below 2^31.
        obs, _ = env.reset(seed=cast(Any, (per_env >> 1).astype(np.int64)))
    else:
        obs, _ = env.reset(seed=int(seeds.generate_state(1, dtype=np.uint32)[0]))
    return as_observations(obs)


def observation_dtype(obs_shape: tuple[int, ...]) -> type[np.generic]:
    """The dtype observations of `obs_shape` are kept in: uint8 for images, else float32."""
    return np.uint8 if is_image(obs_shape) else np.float32


def as_observations(obs: Any) -> npt.NDArray[Any]:
    """A batch of observations as the networks and buffers take it: uint8 images stay uint8
    (a quarter of float32's bytes; the CNN scales them on its device), anything else
    becomes float32."""
    array = np.asarray(obs)
    if array.dtype == np.uint8 and is_image(array.shape[1:]):
        return array
    return array.astype(np.float32, copy=False)
