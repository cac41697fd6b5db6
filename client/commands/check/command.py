"""`fedrl-client check`: this machine, the server's reachability, and settings to train with.

The recommendation comes from a short measured probe with the real code, not
from a table: the vector env and Q-network inference at a few batch widths
(envs per actor), actor processes at a few counts running in parallel, and
the learner's update at a few batch sizes on each device. It reads and
measures only; it writes no file and changes no setting.

How the numbers become settings:

- envs per actor: the smallest width that reaches 90 % of the best measured
  actor throughput. Each vector step pays one inference call whose fixed cost
  (tens of µs) more envs share; past the knee, more envs only stale the
  weights an actor acts with and cost memory.
- actors: the smallest count within 90 % of the best measured aggregate rate,
  at most cores − 1 (the learner keeps one core). One core: serial mode (0).
- device: CUDA when present and faster per update than the CPU.
- batch size (DQN): the largest measured batch whose update rate still keeps
  up with the actors at the engine's replay ratio; a larger batch averages
  more samples per step for the same number of steps.
- minibatch size (PPO, `--algo ppo`): the largest measured minibatch whose
  gradient steps run within 10 % as fast as the default's (256): where the
  device computes a larger minibatch in about the same time (a GPU), it
  averages more samples per step at no cost; where it does not (a CPU),
  fewer, larger steps learn less per env step.
- rollout length (PPO): steps per env so that one update learns from two
  minibatches' worth of samples across all actors' envs, as the defaults do
  (16 envs × 32 steps = 2 × 256).
- replay capacity (DQN on games): the most frames, up to 1M, whose replay
  takes at most half of the memory available now (fedrl.client.training.memory);
  each frame is kept once, about one per transition. Games are probed with
  their own settings (fedrl.client.commands.game_defaults), e.g. one update
  per 4 env steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import platform
import socket
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

import click
import grpc
import numpy as np
import psutil
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedrl.client.commands.game_defaults import GAME_ENGINE
from fedrl.client.commands.gpu_stats import GpuMonitor, GpuReading
from fedrl.client.federation.channel import ConnectionSecurity, is_loopback_target
from fedrl.client.training.cnn import is_image
from fedrl.client.training.engine_config import EngineConfig, available_cores
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.memory import available_bytes, fitting_capacity, replay_bytes
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ActorCritic, build_actor_critic
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import EnvShape, env_shape, make_vector_env
from fedrl.common.config_cli import doc, section, takes_config
from fedrl.common.tls import ParticipantBundle
from fedrl.envs.atari import is_atari

ENV_WIDTHS = (1, 4, 16, 64)
BATCH_SIZES = (32, 64, 128, 256)
QUICK_ENV_WIDTHS = (4, 32)
QUICK_BATCH_SIZES = (32, 128)
MINIBATCH_SIZES = (256, 512, 1024, 2048)
QUICK_MINIBATCH_SIZES = (256, 1024)
MINIBATCHES_PER_UPDATE = 2
"""Samples per PPO update, in minibatches: what the defaults give (16 envs × 32 steps, 256)."""
MIN_ROLLOUT_STEPS = 8
"""Fewer steps per env and rollout leave GAE almost no steps to look ahead over."""
Algorithm = Literal["dqn", "ppo"]
KNEE = 0.9
"""Share of the best measured rate that counts as "as good": below 10 % the
difference is inside the noise of a busy machine, and the cheaper setting wins."""


class ProbeError(RuntimeError):
    """A part of the probe could not run; the check reports it and goes on without it."""


@dataclass(frozen=True)
class CheckConfig:
    """The system check."""

    env: str = field(
        default="CartPole-v1",
        metadata=doc("Gymnasium env id to probe with (the one you will train)."),
    )
    algo: Algorithm = field(
        default="dqn",
        metadata=doc(
            "Recommend for this algorithm: DQN's batch size, or PPO's rollout length and "
            "minibatch size."
        ),
    )
    hidden: tuple[int, ...] = field(
        default=(256, 256),
        metadata=doc(
            "Hidden layer widths of the network to probe with (for --algo ppo, 64,64 unless given)."
        ),
    )
    server: str = field(
        default="",
        metadata=doc("host:port of a fedrl server to check (reachability, TLS); empty to skip."),
    )
    tls: ConnectionSecurity = field(
        default_factory=ConnectionSecurity,
        # The health call the check makes needs no participant credentials.
        metadata=section("How to reach the server.", omit=("token_file",)),
    )
    quick: bool = field(
        default=False,
        metadata=doc("A ~3 s probe at fewer settings instead of ~15 s (rougher recommendation)."),
    )
    as_json: bool = field(
        default=False, metadata=doc("Print the report as one JSON object.", flag="--json")
    )

    def __post_init__(self) -> None:
        if self.algo not in ("dqn", "ppo"):
            raise ValueError(f"algo must be dqn or ppo, got {self.algo!r}")
        if any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be positive, got {self.hidden}")

    @property
    def probe_s(self) -> float:
        """Seconds each single measurement runs."""
        return 0.15 if self.quick else 0.5


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    capability: str
    bf16: bool


@dataclass(frozen=True)
class Machine:
    """Facts about this machine and its software."""

    cpu: str
    cores_usable: int
    cores_logical: int
    cores_physical: int | None
    memory_gib: float
    memory_available_gib: float
    cuda: str | None
    gpus: tuple[Gpu, ...]
    versions: dict[str, str]
    gpu_readings: tuple[GpuReading, ...] = ()
    """Every GPU as NVIDIA's management library sees it now: utilisation, memory, temperature."""
    gpu_readings_missing: str | None = None
    """Why there are no readings, in words; None when there are."""


@dataclass(frozen=True)
class ServerCheck:
    """What a connection to the server showed; `problems` empty means all good."""

    target: str
    reachable: bool
    tls: str
    """"verified (...)", "plaintext (...)", or why the certificate does not verify."""
    service: str
    """The gRPC health answer, or the error that came instead."""
    problems: tuple[str, ...]


@dataclass(frozen=True)
class WidthProbe:
    envs: int
    env_steps_per_s: float
    """Env steps/s of stepping alone, random actions."""
    inference_us: float
    """Microseconds of one Q-network forward pass at this batch width."""
    actor_steps_per_s: float
    """Env steps/s of an actor: stepping plus one inference per vector step."""


@dataclass(frozen=True)
class UpdateProbe:
    device: str
    batch_size: int
    updates_per_s: float


@dataclass(frozen=True)
class Recommendation:
    workers: int
    envs_per_worker: int
    batch_size: int
    """DQN: samples per update; PPO: the minibatch size."""
    device: str
    reasons: tuple[str, ...]
    rollout_steps: int | None = None
    """PPO only: steps per env and rollout."""
    replay_capacity: int | None = None
    """DQN on games: frames the replay holds."""
    env: str = ""
    """The env the recommendation is for, named in the command where it is not the default."""

    def command(self) -> str:
        env = f" --env {self.env}" if self.env and self.env != EngineConfig().env else ""
        collection = f"--workers {self.workers} --envs-per-worker {self.envs_per_worker}"
        if self.rollout_steps is not None:
            return (
                f"fedrl-client --algo ppo{env} {collection} --rollout-steps {self.rollout_steps} "
                f"--minibatch-size {self.batch_size} --device {self.device}"
            )
        capacity = (
            f" --replay-capacity {self.replay_capacity}" if self.replay_capacity is not None else ""
        )
        return (
            f"fedrl-client{env} {collection} --batch-size {self.batch_size}{capacity} "
            f"--device {self.device}"
        )


@dataclass(frozen=True)
class Report:
    machine: Machine
    server: ServerCheck | None
    widths: tuple[WidthProbe, ...]
    workers: dict[int, float]
    """Aggregate actor env steps/s by number of parallel actor processes."""
    updates: tuple[UpdateProbe, ...]
    recommendation: Recommendation
    probe_seconds: float
    problems: tuple[str, ...]
    """Parts of the probe that failed; the recommendation was made without them."""


# -- facts -------------------------------------------------------------------


def machine_facts() -> Machine:
    memory = psutil.virtual_memory()
    gpus: list[Gpu] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            with torch.cuda.device(index):
                bf16 = torch.cuda.is_bf16_supported()
            gpus.append(
                Gpu(
                    name=props.name,
                    memory_gib=props.total_memory / 2**30,
                    capability=f"{props.major}.{props.minor}",
                    bf16=bf16,
                )
            )
    monitor = GpuMonitor()
    try:
        readings = monitor.read()
    finally:
        monitor.close()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("grpcio", "protobuf", "numpy", "gymnasium", "fedrl"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return Machine(
        cpu=_cpu_name(),
        cores_usable=available_cores(),
        cores_logical=os.cpu_count() or 1,
        cores_physical=psutil.cpu_count(logical=False),
        memory_gib=memory.total / 2**30,
        memory_available_gib=memory.available / 2**30,
        cuda=torch.version.cuda if torch.cuda.is_available() else None,
        gpus=tuple(gpus),
        versions=versions,
        gpu_readings=readings,
        gpu_readings_missing=monitor.none_reason,
    )


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# -- the server ----------------------------------------------------------------


def check_server(
    target: str,
    *,
    ca_cert: Path | None,
    insecure: bool,
    bundle: ParticipantBundle | None = None,
    timeout_s: float = 5.0,
) -> ServerCheck:
    """TCP reachability, the server's TLS certificate (verified as gRPC would), a health call.

    With a participant bundle the health call runs over mutual TLS, so it also
    shows whether the server accepts this participant's certificate.
    """
    host, port = _split_target(target)
    problems: list[str] = []
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return ServerCheck(target, False, "-", "-", (f"cannot connect to {target}: {reason}",))
    ca_pem = bundle.ca_pem if bundle is not None else _read_ca(ca_cert)
    plaintext = ca_pem is None and (insecure or is_loopback_target(target))
    if plaintext:
        tls = "plaintext (" + ("--insecure" if insecure else "loopback") + ")"
    else:
        tls = _verify_tls(host, port, ca_pem, timeout_s)
        if not tls.startswith("verified"):
            problems.append(f"TLS: {tls}")
    if plaintext:
        credentials = None
    elif bundle is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=bundle.ca_pem,
            private_key=bundle.key_pem,
            certificate_chain=bundle.cert_pem,
        )
    else:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    service = _health(target, credentials, timeout_s)
    if service != "SERVING":
        hint = ""
        if bundle is None and not plaintext and tls.startswith("verified"):
            hint = " (a server with mutual TLS needs your participant bundle: pass --bundle)"
        problems.append(f"gRPC: {service}{hint}")
    return ServerCheck(target, True, tls, service, tuple(problems))


def _read_ca(ca_cert: Path | None) -> bytes | None:
    if ca_cert is None:
        return None
    try:
        return ca_cert.read_bytes()
    except OSError as exc:
        raise ValueError(f"--ca-cert {ca_cert}: {exc.strerror}") from None


def _split_target(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--server must be host:port, got {target!r}")
    return host.strip("[]"), int(port)


def _verify_tls(host: str, port: int, ca_pem: bytes | None, timeout_s: float) -> str:
    """The handshake gRPC will do: chain to the CA (or the system's roots) and the host name."""
    context = ssl.create_default_context()
    if ca_pem is not None:
        context = ssl.create_default_context(cadata=ca_pem.decode("ascii", "replace"))
    context.set_alpn_protocols(["h2"])
    roots = "the session CA" if ca_pem is not None else "the system's trusted roots"
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            cert = tls.getpeercert() or {}
            until = cert.get("notAfter", "?")
            return f"verified against {roots}, valid until {until}, {tls.version()}"
    except ssl.SSLCertVerificationError as exc:
        hint = "" if ca_pem is not None else "; pass --ca-cert with the session's CA"
        return f"certificate does not verify against {roots}: {exc.verify_message}{hint}"
    except ssl.SSLError as exc:
        return f"TLS handshake failed ({exc.reason or exc}); is the server serving TLS?"
    except OSError as exc:
        return f"TLS handshake failed: {exc.strerror or exc}"


def _health(target: str, credentials: grpc.ChannelCredentials | None, timeout_s: float) -> str:
    """The standard health service's answer; servers exempt it from participant auth."""
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


# -- the probe -------------------------------------------------------------------


def _timed(call: Callable[[], int], seconds: float) -> float:
    """Units per second of `call` (which returns units done) over about `seconds`."""
    call()  # warm-up: first calls pay allocation and lazy initialisation
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += call()
    return done / elapsed


def _actor_network(algo: Algorithm, shape: EnvShape, hidden: tuple[int, ...]) -> torch.nn.Module:
    """The network an actor of `algo` runs: the Q-network or the actor-critic."""
    if algo == "ppo":
        return build_actor_critic(
            shape.obs_shape, shape, hidden=hidden, network=NetworkConfig()
        ).eval()
    return build_q_network(shape.obs_shape, shape.n_actions, hidden=hidden, dueling=True).eval()


def _act(net: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        if isinstance(net, ActorCritic):
            params, _ = net(obs)  # the value comes with every action: PPO records it
            return net.sample(params)
        action: torch.Tensor = net(obs).argmax(dim=1)
        return action


def probe_widths(
    env_id: str,
    hidden: tuple[int, ...],
    widths: Sequence[int],
    seconds: float,
    *,
    algo: Algorithm = "dqn",
) -> list[WidthProbe]:
    """Env stepping and actor inference at each batch width, in this process, one thread."""
    out = []
    for width in widths:
        env = make_vector_env(env_id, width)
        try:
            shape = env_shape(env, continuous=algo == "ppo")
            env.reset(seed=0)
            env.action_space.seed(0)
            actions = [env.action_space.sample() for _ in range(8)]

            def step(env: Any = env, actions: list[Any] = actions) -> int:
                for action in actions:
                    env.step(action)
                return len(actions) * int(env.num_envs)

            env_rate = _timed(step, seconds)
        finally:
            env.close()
        net = _actor_network(algo, shape, hidden)
        obs = torch.zeros((width, *shape.obs_shape))

        def infer(net: torch.nn.Module = net, obs: torch.Tensor = obs) -> int:
            for _ in range(8):
                _act(net, obs)
            return 8

        calls_per_s = _timed(infer, seconds)
        inference_s = 1.0 / calls_per_s
        actor_rate = width / (width / env_rate + inference_s)
        out.append(WidthProbe(width, env_rate, inference_s * 1e6, actor_rate))
    return out


def _actor_worker(
    env_id: str, width: int, hidden: tuple[int, ...], conn: Connection, algo: Algorithm = "dqn"
) -> None:
    """One parallel actor for the probe: steps and infers for as long as it is told to."""
    torch.set_num_threads(1)  # as the engine's actors do
    env = make_vector_env(env_id, width)
    shape = env_shape(env, continuous=algo == "ppo")
    net = _actor_network(algo, shape, hidden)
    obs, _ = env.reset(seed=os.getpid())
    conn.send("ready")
    try:
        while (seconds := conn.recv()) is not None:
            steps, end = 0, time.perf_counter() + float(seconds)
            while time.perf_counter() < end:
                action = _act(net, torch.from_numpy(np.asarray(obs, np.float32)))
                obs, *_ = env.step(action.numpy())
                steps += width
            conn.send(steps / float(seconds))
    finally:
        env.close()
        conn.close()


def probe_workers(
    env_id: str,
    hidden: tuple[int, ...],
    width: int,
    counts: Sequence[int],
    seconds: float,
    *,
    algo: Algorithm = "dqn",
) -> dict[int, float]:
    """Aggregate env steps/s with each count of actor processes running at once.

    The processes start once (spawned, like the engine's actors) and are
    reused for every count, so the probe pays their start-up only once.
    """
    if not counts:
        return {}
    ctx = mp.get_context("spawn")
    pipes: list[Connection] = []
    processes = []
    try:
        for _ in range(max(counts)):
            parent, child = ctx.Pipe()
            process = ctx.Process(
                target=_actor_worker, args=(env_id, width, hidden, child, algo), daemon=True
            )
            process.start()
            child.close()
            pipes.append(parent)
            processes.append(process)
        for pipe in pipes:
            if not pipe.poll(120.0) or pipe.recv() != "ready":
                raise ProbeError("a probe actor process did not start within 120 s")
        rates: dict[int, float] = {}
        for count in counts:
            for pipe in pipes[:count]:
                pipe.send(seconds)
            rates[count] = sum(float(pipe.recv()) for pipe in pipes[:count])
        return rates
    except (EOFError, OSError) as exc:
        codes = [p.exitcode for p in processes if p.exitcode is not None]
        raise ProbeError(
            f"a probe actor process died (exit codes {codes}); its error is printed above"
        ) from exc
    finally:
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
            pipe.close()
        for process in processes:
            process.join(timeout=10.0)
            if process.is_alive():
                process.kill()
                process.join()


def probe_updates(
    *,
    obs_shape: tuple[int, ...],
    n_actions: int,
    hidden: tuple[int, ...],
    device: str,
    batch_sizes: Sequence[int],
    seconds: float,
) -> list[UpdateProbe]:
    """The learner's own train step (Double DQN, dueling, PER) at each batch size."""
    rng = np.random.default_rng(0)
    out = []
    for batch_size in batch_sizes:
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

        def train(learner: Learner = learner) -> int:
            learner.train(8)  # returns statistics, which waits for the device: a fair clock
            return 8

        out.append(UpdateProbe(device, batch_size, _timed(train, seconds)))
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


def probe_ppo_updates(
    *,
    shape: EnvShape,
    hidden: tuple[int, ...],
    device: str,
    minibatch_sizes: Sequence[int],
    seconds: float,
) -> list[UpdateProbe]:
    """PPO's own gradient steps (one epoch over a synthetic rollout) at each minibatch size."""
    rng = np.random.default_rng(0)
    out = []
    for size in minibatch_sizes:
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

        def train(learner: PPOLearner = learner, rollout: Rollout = rollout) -> int:
            learner.train(rollout)  # returns statistics, which waits for the device
            return -(-rollout.steps * rollout.envs // learner.config.minibatch_size)

        out.append(UpdateProbe(device, size, _timed(train, seconds)))
    return out


# -- the recommendation ----------------------------------------------------------


def _knee(rates: dict[int, float]) -> int:
    """The smallest setting within KNEE of the best."""
    best = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= KNEE * best)


def recommend(
    cores: int,
    widths: Sequence[WidthProbe],
    workers: dict[int, float],
    updates: Sequence[UpdateProbe],
    replay_ratio: float,
) -> Recommendation:
    """Settings from the measurements; each comes with the reason, in numbers."""
    width = _knee({p.envs: p.actor_steps_per_s for p in widths})
    chosen = next(p for p in widths if p.envs == width)
    reasons = [
        f"envs per worker {width}: {chosen.actor_steps_per_s:,.0f} steps/s per actor, within "
        f"{1 - KNEE:.0%} of the best width measured; inference costs {chosen.inference_us:.0f} µs "
        "per vector step"
    ]

    # Collection: as many actors as still add speed, one core left to the learner.
    if cores <= 1:
        count, collect = 0, chosen.actor_steps_per_s
        workers_reason = "workers 0 (serial): one usable core, shared by actor and learner"
    elif not workers:
        count, collect = cores - 1, (cores - 1) * chosen.actor_steps_per_s
        workers_reason = (
            f"workers {count}: cores − 1, one core stays with the learner (parallel actors not "
            f"measured; {collect:,.0f} env steps/s estimated from one actor)"
        )
    else:
        count = _knee(workers)
        collect = workers[count]
        measured = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(workers.items()))
        workers_reason = (
            f"workers {count}: {collect:,.0f} env steps/s together (measured {measured}); "
            "one core stays with the learner"
        )

    # Learning: the device faster at the default batch of 64, then the largest
    # batch whose update rate still keeps up with collection.
    by_device: dict[str, list[UpdateProbe]] = {}
    for probe in updates:
        by_device.setdefault(probe.device, []).append(probe)
    device = max(
        by_device,
        key=lambda d: min(by_device[d], key=lambda p: abs(p.batch_size - 64)).updates_per_s,
    )
    device_reason = (
        f"device {device}: the faster update of those measured"
        if len(by_device) > 1
        else f"device {device}: no CUDA device here"
    )
    needed = replay_ratio * collect
    probes = sorted(by_device[device], key=lambda p: p.batch_size)
    keeping_up = [p for p in probes if p.updates_per_s >= needed]
    if keeping_up:
        pick = keeping_up[-1]
        batch_reason = (
            f"batch size {pick.batch_size}: {pick.updates_per_s:,.0f} updates/s keeps up with "
            f"the {needed:,.0f} needed (replay ratio {replay_ratio} × {collect:,.0f} steps/s)"
        )
    else:
        pick = max(probes, key=lambda p: p.updates_per_s)
        consumed = pick.updates_per_s / replay_ratio
        batch_reason = (
            f"batch size {pick.batch_size}: the fastest update measured, "
            f"{pick.updates_per_s:,.0f}/s, and still the learner sets the pace: it consumes "
            f"{consumed:,.0f} env steps/s at replay ratio {replay_ratio}, the actors make "
            f"{collect:,.0f}; the engine holds them back"
        )
        # Actors beyond what the learner consumes only wait, holding cores and memory.
        enough = [k for k, rate in sorted(workers.items()) if rate >= consumed]
        if workers and count > (fewer := enough[0] if enough else min(workers)):
            count = fewer
            workers_reason = (
                f"workers {count}: enough for the {consumed:,.0f} env steps/s the learner "
                f"consumes (measured {workers[count]:,.0f})"
            )
    reasons += [workers_reason, device_reason, batch_reason]
    return Recommendation(count, width, pick.batch_size, device, tuple(reasons))


def recommend_ppo(
    cores: int,
    widths: Sequence[WidthProbe],
    workers: dict[int, float],
    updates: Sequence[UpdateProbe],
) -> Recommendation:
    """PPO's settings from the measurements: collection as for DQN, then minibatch and rollout."""
    collection = recommend(cores, widths, workers, updates, replay_ratio=1.0)
    by_device: dict[str, dict[int, float]] = {}
    for probe in updates:
        by_device.setdefault(probe.device, {})[probe.batch_size] = probe.updates_per_s
    base = PPOConfig().minibatch_size

    def rate_at_base(device: str) -> float:
        return by_device[device].get(base, max(by_device[device].values()))

    device = max(by_device, key=rate_at_base)
    rates = by_device[device]
    reference = rate_at_base(device)
    minibatch = max(
        (size for size, rate in rates.items() if rate >= KNEE * reference and size >= base),
        default=base,
    )
    measured = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(rates.items()))
    minibatch_reason = (
        f"minibatch size {minibatch}: {rates.get(minibatch, reference):,.0f} gradient steps/s "
        f"on {device}, within {1 - KNEE:.0%} of the {reference:,.0f}/s at {base} "
        f"(measured {measured})"
        if minibatch != base
        else f"minibatch size {base}: larger ones take longer per gradient step on {device} "
        f"(gradient steps/s measured {measured})"
    )
    envs = max(1, collection.workers) * collection.envs_per_worker
    needed = -(-MINIBATCHES_PER_UPDATE * minibatch // envs)
    rollout = max(MIN_ROLLOUT_STEPS, needed)
    rollout_reason = (
        f"rollout steps {rollout}: {envs} envs × {rollout} steps = {envs * rollout:,} samples per "
        f"update, {MINIBATCHES_PER_UPDATE} minibatches of {minibatch}"
        + (
            f" or more (at least {MIN_ROLLOUT_STEPS} steps: GAE needs a horizon)"
            if needed < MIN_ROLLOUT_STEPS
            else ""
        )
    )
    device_reason = (
        f"device {device}: the faster gradient step of those measured"
        if len(by_device) > 1
        else f"device {device}: no CUDA device here"
    )
    collect_reasons = collection.reasons[:2]
    if collection.workers == 1:
        collect_reasons = (
            collect_reasons[0],
            "workers 1: one actor, which PPO runs in the learner's process (collection and "
            "learning take turns, so a process of its own would overlap with nothing)",
        )
    return Recommendation(
        collection.workers,
        collection.envs_per_worker,
        minibatch,
        device,
        (*collect_reasons, device_reason, minibatch_reason, rollout_reason),
        rollout_steps=rollout,
    )


def with_capacity(recommendation: Recommendation, obs_shape: tuple[int, ...]) -> Recommendation:
    """The recommendation with the replay capacity that fits the memory available now."""
    available = available_bytes()
    capacity = fitting_capacity(obs_shape, available=available)
    size = replay_bytes(capacity, obs_shape)
    reason = (
        f"replay capacity {capacity:,}: {size / 1e9:.1f} GB with each frame kept once, at most "
        f"half of the {available / 1e9:.1f} GB available (up to the 1M transitions of the "
        "Nature DQN)"
    )
    return dataclasses.replace(
        recommendation,
        replay_capacity=capacity,
        reasons=(*recommendation.reasons, reason),
    )


def run_check(config: CheckConfig, *, echo: Callable[[str], None] = lambda _: None) -> Report:
    """Facts, the server check and the probe; `echo` hears what is being measured."""
    start = time.perf_counter()
    machine = machine_facts()
    server = None
    if config.server:
        echo(f"checking {config.server} ...")
        server = check_server(
            config.server,
            ca_cert=config.tls.ca_cert,
            insecure=config.tls.insecure,
            bundle=config.tls.read_bundle(),
        )
    ppo = config.algo == "ppo"
    hidden = (
        PPOConfig().ppo_hidden if ppo and config.hidden == CheckConfig.hidden else config.hidden
    )
    probe = make_vector_env(config.env, 1)
    try:
        shape = env_shape(probe, continuous=ppo)
    finally:
        probe.close()
    seconds = config.probe_s
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # actors and the default learner run one thread each
    try:
        echo("probing env stepping and inference ...")
        widths = probe_widths(
            config.env,
            hidden,
            QUICK_ENV_WIDTHS if config.quick else ENV_WIDTHS,
            seconds,
            algo=config.algo,
        )
        echo("probing learner updates ...")
        devices = ["cpu"] + (["cuda"] if machine.gpus else [])
        if ppo:
            sizes = QUICK_MINIBATCH_SIZES if config.quick else MINIBATCH_SIZES
            updates = [
                probe
                for device in devices
                for probe in probe_ppo_updates(
                    shape=shape,
                    hidden=hidden,
                    device=device,
                    minibatch_sizes=sizes,
                    seconds=seconds,
                )
            ]
        else:
            sizes = QUICK_BATCH_SIZES if config.quick else BATCH_SIZES
            updates = [
                probe
                for device in devices
                for probe in probe_updates(
                    obs_shape=shape.obs_shape,
                    n_actions=shape.n_actions,
                    hidden=hidden,
                    device=device,
                    batch_sizes=sizes,
                    seconds=seconds,
                )
            ]
    finally:
        torch.set_num_threads(threads)
    cores = machine.cores_usable
    counts = _worker_counts(cores - 1, quick=config.quick)
    width = _knee({p.envs: p.actor_steps_per_s for p in widths})
    problems: list[str] = []
    workers: dict[int, float] = {}
    if counts:
        echo(f"probing {', '.join(map(str, counts))} parallel actor process(es) ...")
        try:
            workers = probe_workers(
                config.env, hidden, width, counts, 3 * seconds, algo=config.algo
            )
        except ProbeError as exc:
            problems.append(f"parallel actor probe: {exc}; workers recommended without it")
    game = is_atari(config.env)
    if ppo:
        recommendation = recommend_ppo(cores, widths, workers, updates)
    else:
        ratio = GAME_ENGINE["replay_ratio"] if game else EngineConfig().replay_ratio
        recommendation = recommend(cores, widths, workers, updates, replay_ratio=ratio)
        if is_image(shape.obs_shape):
            recommendation = with_capacity(recommendation, shape.obs_shape)
    recommendation = dataclasses.replace(recommendation, env=config.env)
    return Report(
        machine=machine,
        server=server,
        widths=tuple(widths),
        workers=workers,
        updates=tuple(updates),
        recommendation=recommendation,
        probe_seconds=time.perf_counter() - start,
        problems=tuple(problems),
    )


def _worker_counts(most: int, *, quick: bool) -> list[int]:
    """Actor counts to measure in parallel; none in quick mode (spawning costs seconds)."""
    if most < 1 or quick:
        return []
    return sorted({1, max(1, most // 2), most})


# -- output ------------------------------------------------------------------------


def render(report: Report) -> str:
    m = report.machine
    lines = ["Machine"]
    physical = f", {m.cores_physical} physical" if m.cores_physical else ""
    lines += [
        f"  cpu        {m.cpu}",
        f"  cores      {m.cores_usable} usable of {m.cores_logical} logical{physical}",
        f"  memory     {m.memory_gib:.1f} GiB, {m.memory_available_gib:.1f} GiB available",
    ]
    if m.gpus:
        lines.append(f"  cuda       {m.cuda}")
        for index, gpu in enumerate(m.gpus):
            lines.append(
                f"  gpu {index}      {gpu.name}, {gpu.memory_gib:.1f} GiB, compute "
                f"{gpu.capability}, bf16 {'yes' if gpu.bf16 else 'no'}"
            )
    else:
        lines.append("  gpu        none (CUDA not available to torch)")
    if m.gpu_readings:
        lines += [f"  nvml       {reading.line()}" for reading in m.gpu_readings]
    else:
        lines.append(f"  nvml       no GPU readings: {m.gpu_readings_missing}")
    lines.append("  versions   " + ", ".join(f"{k} {v}" for k, v in m.versions.items()))
    if report.server is not None:
        s = report.server
        lines += ["", f"Server {s.target}"]
        lines.append(f"  reachable  {'yes' if s.reachable else 'no'}")
        lines.append(f"  tls        {s.tls}")
        lines.append(f"  health     {s.service}")
        lines += [f"  PROBLEM    {p}" for p in s.problems]
    lines += ["", "Probe (measured here, one thread each)"]
    for p in report.widths:
        lines.append(
            f"  {p.envs:>3} envs   env {p.env_steps_per_s:>11,.0f} steps/s   inference "
            f"{p.inference_us:>7.0f} µs   actor {p.actor_steps_per_s:>11,.0f} steps/s"
        )
    for count, rate in sorted(report.workers.items()):
        lines.append(f"  {count:>3} actors {rate:>11,.0f} env steps/s together")
    for u in report.updates:
        lines.append(
            f"  {u.device:<4} batch {u.batch_size:>4}   {u.updates_per_s:>9,.0f} updates/s   "
            f"{u.updates_per_s * u.batch_size:>11,.0f} samples/s"
        )
    rec = report.recommendation
    lines += ["", "Recommendation", f"  {rec.command()}"]
    lines += [f"  - {reason}" for reason in rec.reasons]
    lines += [f"  PROBLEM {problem}" for problem in report.problems]
    lines.append(f"  (probe took {report.probe_seconds:.1f} s; nothing was changed)")
    return "\n".join(lines)


@click.command("check")
@takes_config(CheckConfig)
def check_command(config: CheckConfig) -> None:
    """Report this machine and the server, and recommend settings from a short measured probe."""
    try:
        report = run_check(config, echo=lambda line: click.echo(line, err=True))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if config.as_json:
        click.echo(json.dumps(asdict(report), ensure_ascii=False, default=str))
    else:
        click.echo(render(report))
    if report.server is not None and report.server.problems:
        sys.exit(1)
