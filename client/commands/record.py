"""`fedrl-client record`: a video of a model playing greedily, with the score drawn on it.

The model is a file (a state dir's model.pt or best.pt, a server checkpoint
vNNNNNNNN.npz) or a session's global model, pulled from the server; its
network is rebuilt from its tensors (fedrl.client.training.architecture).
It plays `--episodes` episodes of the env with its greedy action (a DQN's
largest Q-value, a policy's most probable action or mean) on the same
observations as in training, while the env renders each step as rgb_array:
any env that renders so works, CartPole as well as Atari, where the frames
are the game's own colour screen (fedrl.envs.atari). The score is the sum
of the env's raw rewards. Video: fedrl.client.commands.video.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.commands.export import ExportError, LoadedModel, load_model
from fedrl.client.commands.video import VideoWriter, scale, with_caption
from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.federation.errors import ServerCallError
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.training.architecture import (
    ArchitectureError,
    build_from_tensors,
    infer_architecture,
)
from fedrl.client.training.policy_network import ActorCritic
from fedrl.client.training.vector_env import (
    as_observations,
    env_shape,
    make_vector_env,
    reset_seeded,
)
from fedrl.common.config_cli import doc, section, takes_config
from fedrl.common.config_help import ConfigCommand

MIN_HEIGHT = 400
"""Frames are scaled up by a whole factor to at least this height (Atari's are 210)."""


class RecordError(ValueError):
    """Nothing to record, or a model that cannot play the env; the message says why."""


@dataclass(frozen=True)
class RecordConfig:
    """The record command."""

    out: Path = field(
        metadata=doc(
            "The video: .mp4 (H.264), or .gif; an .mp4 is written as a GIF beside it where no "
            "H.264 encoder is installed. Refused if it exists, unless --overwrite.",
            path="file",
        ),
    )
    model: Path | None = field(
        default=None,
        metadata=doc(
            "A model file: model.pt or best.pt of a state dir, or a server checkpoint "
            "vNNNNNNNN.npz. Or give --server.",
            path="file",
            exists=True,
        ),
    )
    server: str = field(
        default="",
        metadata=doc("Play a session's global model, pulled from this server (host:port)."),
    )
    session: str = field(default="default", metadata=doc("With --server: the session."))
    version: int = field(
        default=-1, metadata=doc("With --server: the global version; -1 for the newest.")
    )
    participant_id: str = field(
        default="",
        metadata=doc("With --server: who asks (the server answers participants only)."),
    )
    tls: ConnectionSecurity = field(
        default_factory=ConnectionSecurity,
        metadata=section("With --server: how to reach it."),
    )
    env: str = field(
        default="",
        metadata=doc(
            "Gymnasium env id to play; defaults to the one saved with the model (needed for "
            "server checkpoints and --server)."
        ),
    )
    episodes: int = field(default=1, metadata=doc("Episodes to play, one after the other."))
    max_steps: int = field(
        default=4_500,
        metadata=doc(
            "Steps after which an episode is cut: a greedy policy may never end one (a Breakout "
            "agent that does not serve). 4,500 Atari steps are 5 minutes of play."
        ),
    )
    fps: int = field(default=30, metadata=doc("Frames per second of the video."))
    seed: int = field(default=0, metadata=doc("Seeds the episodes' starts."))
    overwrite: bool = field(default=False, metadata=doc("Replace --out if it exists."))

    def __post_init__(self) -> None:
        if (self.model is None) == (not self.server):
            raise ValueError("give either --model or --server")
        for name in ("episodes", "max_steps", "fps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.version < -1:
            raise ValueError(f"version must be -1 (the newest) or a version, got {self.version}")


@dataclass(frozen=True)
class Recording:
    """What was written."""

    path: Path
    frames: int
    scores: tuple[float, ...]
    """Each episode's score: the sum of the env's raw rewards."""
    source: str
    """Which model played, in words."""


def record(config: RecordConfig) -> Recording:
    """Plays the episodes into the video; RecordError for a model or env that cannot."""
    if config.out.exists() and not config.overwrite:
        raise RecordError(f"{config.out} exists; pass --overwrite to replace it")
    loaded, source = _model(config)
    env_id = config.env or loaded.env
    if env_id is None:
        raise RecordError(f"{source} does not say which env it plays: pass --env")
    try:
        arch = infer_architecture(loaded.tensors)
    except ArchitectureError as exc:
        raise RecordError(str(exc)) from exc
    env = make_vector_env(env_id, 1, window=arch.window, render=True)
    try:
        shape = env_shape(env, continuous=True)
        try:
            net = build_from_tensors(loaded.tensors, shape.obs_shape, shape)
        except ArchitectureError as exc:
            raise RecordError(f"{env_id}: {exc}") from exc
        config.out.parent.mkdir(parents=True, exist_ok=True)
        with VideoWriter(config.out, fps=config.fps) as video:
            scores = _play(env, _greedy(net), video, config)
    finally:
        env.close()
    return Recording(path=video.written, frames=video.frames, scores=scores, source=source)


def _model(config: RecordConfig) -> tuple[LoadedModel, str]:
    if config.model is not None:
        try:
            return load_model(config.model), str(config.model)
        except ExportError as exc:
            raise RecordError(str(exc)) from exc
    return asyncio.run(_pull(config))


async def _pull(config: RecordConfig) -> tuple[LoadedModel, str]:
    bundle = config.tls.read_bundle()
    pid = bundle.participant_id if bundle is not None else config.participant_id
    if not pid:
        raise RecordError("--server: the server answers participants only; pass --participant-id")
    channel = config.tls.open(config.server, participant_id=pid)
    try:
        client = FederationClient(channel, participant_id=pid, session=config.session)
        model = await client.pull_model(version=config.version)
    except ServerCallError as exc:
        raise RecordError(f"--server {config.server}: {exc}") from exc
    finally:
        await channel.close()
    return LoadedModel(list(model.tensors), env=None), (
        f"global version {model.version} of session {config.session!r}"
    )


def _greedy(net: torch.nn.Module) -> Callable[[npt.NDArray[Any]], npt.NDArray[np.generic]]:
    def act(obs: npt.NDArray[Any]) -> npt.NDArray[np.generic]:
        with torch.inference_mode():
            batch = torch.from_numpy(obs)
            if isinstance(net, ActorCritic):
                action: npt.NDArray[np.generic] = net.greedy(batch).numpy()
            else:
                action = net(batch).argmax(dim=1).numpy()
        return action

    return act


def _play(
    env: gym.vector.VectorEnv,
    act: Callable[[npt.NDArray[Any]], npt.NDArray[np.generic]],
    video: VideoWriter,
    config: RecordConfig,
) -> tuple[float, ...]:
    scores = []
    seeds = np.random.SeedSequence(config.seed).spawn(config.episodes)
    for episode, seed in enumerate(seeds, start=1):
        obs = reset_seeded(env, seed)
        score = 0.0

        def show(score: float, episode: int = episode) -> None:
            caption = f"score {score:g}   episode {episode}/{config.episodes}"
            video.add(with_caption(scale(_screen(env), MIN_HEIGHT), caption))

        show(score)
        for _ in range(config.max_steps):
            next_obs, reward, terminated, truncated, _ = env.step(act(obs))
            score += float(np.asarray(reward)[0])
            show(score)
            if bool(np.asarray(terminated)[0] or np.asarray(truncated)[0]):
                break
            obs = as_observations(next_obs)
        scores.append(score)
    return tuple(scores)


def _screen(env: gym.vector.VectorEnv) -> npt.NDArray[np.uint8]:
    frames = env.render()
    if frames is None or not len(frames):
        raise RecordError("the env renders no rgb_array frames")
    return np.asarray(frames[0], dtype=np.uint8)


@click.command("record", cls=ConfigCommand)
@takes_config(RecordConfig)
def record_command(config: RecordConfig) -> None:
    """Play a model greedily and write a video of it, with the score drawn on each frame."""
    try:
        done = record(config)
    except ValueError as exc:  # RecordError, VideoError, a refused env or model
        raise click.ClickException(str(exc)) from exc
    scores = ", ".join(f"{s:g}" for s in done.scores)
    if done.path != config.out:
        click.echo(f"no H.264 encoder here: writing a GIF instead of {config.out}", err=True)
    click.echo(f"wrote {done.path}: {done.frames} frames of {done.source}; scores {scores}")
