"""The check's learner probes: the real DQN update and PPO gradient step on each device.

Each measurement builds the learner the engine would, fills it with random
data shaped as the env's (frame stacks for games), and times its own train
step, which waits for the device's statistics: a fair clock on a GPU too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedrl.client.commands.check.progress import CheckProgress, timed
from fedrl.client.training.cnn import is_image
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import EnvShape


@dataclass(frozen=True)
class UpdateProbe:
    device: str
    batch_size: int
    updates_per_s: float


def probe_updates(
    *,
    obs_shape: tuple[int, ...],
    n_actions: int,
    hidden: tuple[int, ...],
    device: str,
    batch_sizes: Sequence[int],
    seconds: float,
    progress: CheckProgress | None = None,
) -> list[UpdateProbe]:
    """The learner's own train step (Double DQN, dueling, PER) at each batch size: on CUDA the
    device update, captured in one CUDA graph, as training runs it."""

    def dqn_step(batch_size: int, rng: np.random.Generator) -> Callable[[], int]:
        rows = max(2_048, 4 * batch_size)
        learner = Learner(
            obs_shape=obs_shape,
            n_actions=n_actions,
            config=LearnerConfig(
                batch_size=batch_size,
                hidden=hidden,
                device=device,
                learning_starts=rows,
                # Frame stacks: one frame per row and the chain's first stack.
                replay_capacity=rows + obs_shape[0],
            ),
        )
        obs, next_obs = _observations(rng, rows, obs_shape)
        learner.add(
            LearnerTransitions(
                obs=obs,
                action=rng.integers(n_actions, size=rows),
                reward=rng.standard_normal(rows).astype(np.float32),
                next_obs=next_obs,
                discount=np.full(rows, 0.97, dtype=np.float32),
            )
        )

        def train() -> int:
            learner.train(16)
            learner.synchronize()  # the device update queues its work: wait for a fair clock
            return 16

        return train

    return _measure_each(
        "learner update",
        "batch",
        batch_sizes,
        step_at=dqn_step,
        device=device,
        seconds=seconds,
        progress=progress,
    )


def probe_ppo_updates(
    *,
    shape: EnvShape,
    hidden: tuple[int, ...],
    device: str,
    minibatch_sizes: Sequence[int],
    seconds: float,
    progress: CheckProgress | None = None,
) -> list[UpdateProbe]:
    """PPO's own gradient steps (one epoch over a synthetic rollout) at each minibatch size."""

    def ppo_step(size: int, rng: np.random.Generator) -> Callable[[], int]:
        envs, steps = 16, max(1, 4 * size // 16)
        learner = PPOLearner(
            obs_shape=shape.obs_shape,
            shape=shape,
            config=PPOConfig(
                rollout_steps=steps, epochs=1, minibatch_size=size, ppo_hidden=hidden, device=device
            ),
            network=NetworkConfig(),
        )
        action = (
            rng.integers(shape.n_actions, size=(steps, envs))
            if shape.discrete
            else rng.standard_normal((steps, envs, shape.action_dim)).astype(np.float32)
        )
        obs, _ = _observations(rng, steps * envs, shape.obs_shape)
        rollout = Rollout(
            obs=obs.reshape(steps, envs, *shape.obs_shape),
            action=action,
            log_prob=np.full((steps, envs), -0.7, dtype=np.float32),
            value=rng.standard_normal((steps + 1, envs)).astype(np.float32),
            reward=rng.standard_normal((steps, envs)).astype(np.float32),
            terminated=np.zeros((steps, envs), dtype=np.bool_),
            truncated=np.zeros((steps, envs), dtype=np.bool_),
            valid=np.ones((steps, envs), dtype=np.bool_),
        )

        def train() -> int:
            learner.train(rollout)  # returns statistics, which waits for the device
            return -(-rollout.steps * rollout.envs // learner.config.minibatch_size)

        return train

    return _measure_each(
        "PPO update",
        "minibatch",
        minibatch_sizes,
        step_at=ppo_step,
        device=device,
        seconds=seconds,
        progress=progress,
    )


def _measure_each(
    probe: str,
    unit: str,
    sizes: Sequence[int],
    *,
    step_at: Callable[[int, np.random.Generator], Callable[[], int]],
    device: str,
    seconds: float,
    progress: CheckProgress | None,
) -> list[UpdateProbe]:
    """Gradient steps per second at each size: `step_at(size, rng)` builds the learner and
    returns one timed call, which gives the gradient steps it made."""
    progress = progress or CheckProgress()
    rng = np.random.default_rng(0)
    out = []
    for size in sizes:
        progress.begin(probe, f"{unit} {size} on {device}")
        progress.status("building the learner and its data")
        measured = UpdateProbe(device, size, timed(step_at(size, rng), seconds, progress))
        progress.end(f"{measured.updates_per_s:,.0f} updates/s")
        out.append(measured)
    return out


def _observations(
    rng: np.random.Generator, rows: int, obs_shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Random observations and their successors, as the learner stores them: float32 vectors,
    or uint8 frame stacks that follow each other as a game's do."""
    if not is_image(obs_shape):
        return (
            rng.standard_normal((rows, *obs_shape)).astype(np.float32),
            rng.standard_normal((rows, *obs_shape)).astype(np.float32),
        )
    k = obs_shape[0]
    frames = rng.integers(0, 256, (rows + k, *obs_shape[1:]), dtype=np.uint8)
    windows = np.lib.stride_tricks.sliding_window_view(frames, k, axis=0)
    stacks = np.ascontiguousarray(np.moveaxis(windows, -1, 1))  # [rows + 1, k, H, W]
    return stacks[:rows], stacks[1:]
