"""Slow: foreign experience, pulled through a real server, makes a participant learn better.

A teacher participant pushes transitions of a decent CartPole controller
(with exploration noise) through the server. Two students get the same
small budget of their own environment steps and gradient updates; one also
pulls the teacher's transitions into its replay, the other does not. The one
with foreign experience must reach a clearly higher greedy return.
"""

from __future__ import annotations

import asyncio

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl.client.federation.experience_client import ExperienceClient
from fedrl.client.training.experience_conversion import to_experience, to_transitions
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.experience import ExperienceBatch, batch_messages
from tests.support.experience import CONFIG, SPEC_HASH, Server, cartpole_spec
from tests.support.server_harness import join

GAMMA = 0.99
TEACHER_TRANSITIONS = 20_000
# Too few own steps to learn CartPole alone; the updates are the same for both students.
STUDENT_STEPS = 300
UPDATES_PER_STEP = 10
SEEDS = (0, 1, 2)


def teacher_batches(count: int, *, seed: int, batch_rows: int = 2000) -> list[ExperienceBatch]:
    """A pole-angle controller with 20% random actions: long episodes, varied states."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows: list[tuple[np.ndarray, int, float, np.ndarray, float]] = []
    while len(rows) < count:
        action = int(rng.integers(2)) if rng.random() < 0.2 else int(obs[2] + obs[3] > 0)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, float(reward), next_obs, 0.0 if terminated else GAMMA))
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    batches = []
    for start in range(0, count, batch_rows):
        part = rows[start : start + batch_rows]
        local = LearnerTransitions(
            obs=np.array([r[0] for r in part], dtype=np.float32),
            action=np.array([r[1] for r in part], dtype=np.int64),
            reward=np.array([r[2] for r in part], dtype=np.float32),
            next_obs=np.array([r[3] for r in part], dtype=np.float32),
            discount=np.array([r[4] for r in part], dtype=np.float32),
        )
        batches.append(to_experience(local, n_step=1, gamma=GAMMA, spec_hash=SPEC_HASH))
    return batches


def train_student(foreign: list[ExperienceBatch], *, seed: int) -> float:
    """STUDENT_STEPS epsilon-greedy steps, UPDATES_PER_STEP updates each; the greedy return."""
    config = LearnerConfig(
        device="cpu",
        gamma=GAMMA,
        hidden=(64, 64),
        learning_starts=200,
        target_update_interval=250,
        sample_block=1,
        seed=seed,
    )
    learner = Learner(obs_shape=(4,), n_actions=2, config=config)
    for batch in foreign:
        learner.add(to_transitions(batch), foreign=True)
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for step in range(STUDENT_STEPS):
        epsilon = max(0.05, 1.0 - step / (0.5 * STUDENT_STEPS))
        action = int(rng.integers(2)) if rng.random() < epsilon else _greedy(learner, obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        learner.add(
            LearnerTransitions(
                obs=np.array([obs], dtype=np.float32),
                action=np.array([action], dtype=np.int64),
                reward=np.array([reward], dtype=np.float32),
                next_obs=np.array([next_obs], dtype=np.float32),
                discount=np.array([0.0 if terminated else GAMMA], dtype=np.float32),
            )
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
        if learner.ready():
            learner.train(UPDATES_PER_STEP)
    env.close()
    return _evaluate(learner, seed=1000 + seed)


def _greedy(learner: Learner, obs: np.ndarray) -> int:
    with torch.no_grad():
        q = learner.online(torch.as_tensor(np.asarray(obs, dtype=np.float32)[None]))
    return int(q.argmax())


def _evaluate(learner: Learner, *, seed: int, episodes: int = 10) -> float:
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(_greedy(learner, obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


async def _exchange(address: str, batches: list[ExperienceBatch]) -> list[ExperienceBatch]:
    """The teacher pushes every batch; the student pulls them all back, 4096 at a time."""
    async with grpc.aio.insecure_channel(address) as channel:
        teacher = ExperienceClient(channel, participant_id="teacher", session="default")
        student = ExperienceClient(channel, participant_id="student", session="default")
        for sequence, batch in enumerate(batches, start=1):
            await teacher.push(
                batch_messages(
                    batch,
                    session="default",
                    participant_id="teacher",
                    sequence=sequence,
                    chunk_bytes=CONFIG.chunk_bytes,
                )
            )
        pulled: list[ExperienceBatch] = []
        cursor = 0
        while True:
            result = await student.pull(cursor, max_transitions=4096)
            if not result.batches:
                return pulled
            pulled.extend(batch for _, batch in result.batches)
            cursor = result.next_cursor


@pytest.mark.slow
def test_a_participant_training_on_foreign_experience_learns_better(
    experience_server: Server, one_torch_thread: None
) -> None:
    federation, _ = experience_server.stubs()
    for pid in ("teacher", "student"):
        join(federation, pid, cartpole_spec())
    taught = teacher_batches(TEACHER_TRANSITIONS, seed=7)
    foreign = asyncio.run(_exchange(experience_server.address, taught))
    assert sum(len(b) for b in foreign) == TEACHER_TRANSITIONS

    with_foreign = [train_student(foreign, seed=seed) for seed in SEEDS]
    alone = [train_student([], seed=seed) for seed in SEEDS]

    assert np.mean(with_foreign) > np.mean(alone) + 50.0, (with_foreign, alone)
