"""Data-parallel learner ranks on torch.distributed: NCCL on CUDA, gloo on the CPU.

A participant with N learners runs N ranks of the same training engine. Each
rank has its own actors and its own replay shard (DQN) or rollouts (PPO),
trains on batches of its own shard, and before every optimizer step the
ranks average their gradients with one `all_reduce` over the flattened
gradients (torch's own collective; no scheme of ours). N ranks with batch B
thus step exactly as one learner with a batch of N·B made of their batches
(tests/test_distributed_learner.py checks it to float rounding).

Everything else the ranks agree on goes through one small collective per
engine round, `exchange`: every rank's env steps and finished episodes since
the last round, and the replay-ratio credit of other participants'
transitions it took in (so every rank holds the same global counters and
owes the same updates), whether its replay is ready or its rollouts are complete,
whether it asks to stop, and whether rank 0 changed the learner's state
(resumed, adopted a global model, took new hyperparameters), in which case
rank 0's full state follows as one broadcast. Rank 0 owns everything outside
the learner: checkpoints and autosave, metrics, evaluation and the
federation; the other ranks follow it.

The ranks find each other the way torchrun tells them to (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), whether torchrun
started them or `fedrl-client --learners N` did (fedrl.client.commands.learners).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

T = TypeVar("T")

RANK_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a collective waits for a rank that neither answers nor dies. A rank that
dies is noticed at once (its connections close); one that hangs is given this long,
well above rank 0's longest lone work between rounds (an evaluation, a checkpoint)."""
CLOSE_TIMEOUT = datetime.timedelta(seconds=30)
"""How long a closing rank waits for the others to reach the end too."""

EPISODES_PER_ROUND = 128
"""Finished episodes a rank reports per round; more wait for the next round. A round
is one slot or rollout per actor, so a rank rarely finishes more than a few."""

_HEADER = ("env_steps", "episodes", "foreign_credit", "ready", "stop", "changed")
_ROW = len(_HEADER) + 2 * EPISODES_PER_ROUND

_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class GradientSync(Protocol):
    """What a learner needs to train as one rank of several (RankGroup is one)."""

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the ranks."""

    def fewest(self, value: int) -> int:
        """The smallest of every rank's value."""


class RankFailureError(RuntimeError):
    """Another learner rank died or stopped answering; the run cannot go on without it."""


@dataclass(frozen=True)
class RankPlace:
    """Where one rank stands among the others, as torchrun's environment variables say."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside a world of {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local rank {self.local_rank} outside {self.local_world_size} local ranks"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RankPlace | None:
        """The place torchrun (or `--learners`) gave this process; None outside a launch."""
        if "WORLD_SIZE" not in environ or "RANK" not in environ:
            return None
        missing = [key for key in _ENV_KEYS[:2] + _ENV_KEYS[4:] if key not in environ]
        if missing:
            raise ValueError(f"a learner rank needs the environment variables {missing}")
        try:
            world = int(environ["WORLD_SIZE"])
            return cls(
                rank=int(environ["RANK"]),
                world_size=world,
                local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
                local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world)),
                master_addr=environ["MASTER_ADDR"],
                master_port=int(environ["MASTER_PORT"]),
            )
        except ValueError as exc:
            raise ValueError(f"torchrun's environment variables do not parse: {exc}") from None

    def env(self) -> dict[str, str]:
        """The variables torchrun would set for this place."""
        values = (
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_world_size,
            self.master_addr,
            self.master_port,
        )
        return {key: str(value) for key, value in zip(_ENV_KEYS, values, strict=True)}


def rank_device(requested: str, place: RankPlace) -> str:
    """The device of one rank: its local GPU on CUDA (one GPU per rank, as NCCL needs), or the CPU.

    "auto" and "cuda" mean this rank's GPU, cuda:LOCAL_RANK; a fixed "cuda:N"
    would put every rank on one GPU, which NCCL refuses.
    """
    if requested == "cpu":
        return "cpu"
    if requested not in ("auto", "cuda"):
        raise ValueError(
            f"--device {requested} with several learners: use auto or cuda (each rank takes "
            "the GPU of its local rank) or cpu"
        )
    if not torch.cuda.is_available():
        if requested == "cuda":
            raise ValueError("--device cuda requested but CUDA is not available; use cpu or auto")
        return "cpu"
    count = torch.cuda.device_count()
    if place.local_world_size > count:
        raise ValueError(
            f"{place.local_world_size} learners on this machine need as many GPUs for NCCL, "
            f"it has {count}; use --learners {count}, or --device cpu to run them on gloo"
        )
    return f"cuda:{place.local_rank}"


class RankGroup:
    """This process's membership of the learner ranks, and the collectives the engine uses.

    Every collective raises RankFailureError when another rank has died or
    timed out, so the caller can save what it has and stop with a clear error.
    """

    def __init__(self, place: RankPlace, device: str) -> None:
        self.place = place
        self.device = torch.device(device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        os.environ.update(place.env())
        try:
            dist.init_process_group(
                self.backend,
                init_method="env://",
                rank=place.rank,
                world_size=place.world_size,
                timeout=RANK_TIMEOUT,
            )
        except (RuntimeError, ValueError) as exc:
            raise RankFailureError(
                f"learner rank {place.rank} of {place.world_size} could not reach the others at "
                f"{place.master_addr}:{place.master_port}: {exc}"
            ) from exc

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def world_size(self) -> int:
        return self.place.world_size

    @property
    def leads(self) -> bool:
        """Rank 0: the one that saves, evaluates, logs and federates."""
        return self.place.rank == 0

    def close(self) -> None:
        """Leave the group once every rank is done with it.

        A collective can return on one rank while gloo is still sending its
        last bytes to another; a process that exits with such a send in flight
        aborts ("terminate called without an active exception"). The closing
        barrier waits for that, and only briefly where a rank has already died.
        """
        if not dist.is_initialized():
            return
        with contextlib.suppress(RuntimeError):
            if self.backend == "gloo":
                dist.monitored_barrier(timeout=CLOSE_TIMEOUT)
            else:
                torch.cuda.synchronize(self.device)
        dist.destroy_process_group()

    # The collectives.

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the ranks: one all_reduce of all of them.

        A parameter without a gradient contributes zeros, so every rank reduces
        the same buffer even if a head was unused in its batch.
        """
        params = list(parameters)
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )
        self._collective(lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM), "average gradients")
        flat.div_(self.world_size)
        offset = 0
        for p in params:
            size = p.numel()
            grad = flat[offset : offset + size].view_as(p)
            if p.grad is None:
                p.grad = grad.clone()
            else:
                p.grad.copy_(grad)
            offset += size

    def fewest(self, value: int) -> int:
        """The smallest of every rank's `value` (e.g. minibatches an update can take)."""
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        self._collective(lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MIN), "agree on a count")
        return int(tensor.item())

    def exchange(self, row: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Every rank's row, in rank order: [world_size, len(row)]."""
        local = torch.from_numpy(np.ascontiguousarray(row, dtype=np.float64)).to(self.device)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        self._collective(lambda: dist.all_gather(gathered, local), "exchange round figures")
        return np.stack([g.cpu().numpy() for g in gathered])

    def broadcast_state(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's `state` on every rank (others pass None).

        It travels as torch.save bytes and is read with weights_only=True, as
        a state dir's files are: tensors, numbers, strings and containers, no
        code, even if something other than a rank of ours sent it.
        """
        if self.leads:
            if state is None:
                raise ValueError("rank 0 must give the state it broadcasts")
            buffer = io.BytesIO()
            torch.save(state, buffer)
            payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64, device=self.device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._collective(lambda: dist.broadcast(size, src=0), "share the learner's state")
        if self.leads:
            data = payload.to(self.device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self._collective(lambda: dist.broadcast(data, src=0), "share the learner's state")
        if self.leads:
            assert state is not None
            return state
        loaded = torch.load(
            io.BytesIO(data.cpu().numpy().tobytes()), map_location="cpu", weights_only=True
        )
        if not isinstance(loaded, dict):
            raise RankFailureError("rank 0 shared a state that is not a mapping")
        return loaded

    def _collective(self, call: Callable[[], T], what: str) -> T:
        try:
            return call()
        except (RuntimeError, dist.DistError) as exc:
            raise RankFailureError(
                f"learner rank {self.rank} could not {what} with the other "
                f"{self.world_size - 1} rank(s): one died or stopped answering ({exc})"
            ) from exc


@dataclass(frozen=True)
class RoundOutcome:
    """What every rank learns from one exchange; the same on every rank."""

    env_steps: int
    episode_returns: npt.NDArray[np.float64]
    episode_lengths: npt.NDArray[np.int64]
    foreign_credit: float
    """Replay-ratio credit of the other participants' transitions the ranks took in
    (TrainingEngine.add_foreign)."""
    all_ready: bool
    stop: bool
    state_changed: bool


class RoundLedger:
    """A rank's counts since its last report, packed into its row of the round's exchange."""

    def __init__(self) -> None:
        self._env_steps = 0
        self._foreign_credit = 0.0
        self._episodes: deque[tuple[float, int]] = deque()

    def hold(
        self,
        env_steps: int,
        episode_returns: Iterable[float],
        episode_lengths: Iterable[int],
    ) -> None:
        self._env_steps += env_steps
        self._episodes.extend(
            (float(r), int(n)) for r, n in zip(episode_returns, episode_lengths, strict=True)
        )

    def hold_foreign(self, credit: float) -> None:
        """Replay-ratio credit of foreign transitions this rank took in."""
        self._foreign_credit += credit

    def row(self, *, ready: bool, stop: bool, changed: bool) -> npt.NDArray[np.float64]:
        """This rank's row; what it reports is no longer held (episodes past the cap wait)."""
        row = np.zeros(_ROW, dtype=np.float64)
        count = min(len(self._episodes), EPISODES_PER_ROUND)
        sent = [self._episodes.popleft() for _ in range(count)]
        header = len(_HEADER)
        row[:header] = (self._env_steps, len(sent), self._foreign_credit, ready, stop, changed)
        for index, (ret, length) in enumerate(sent):
            row[header + index] = ret
            row[header + EPISODES_PER_ROUND + index] = length
        self._env_steps = 0
        self._foreign_credit = 0.0
        return row


def outcome_of(rows: npt.NDArray[np.float64]) -> RoundOutcome:
    """The round as every rank sees it: sums and concatenations in rank order, rank 0's flags."""
    header = len(_HEADER)
    steps, episodes, foreign, ready, stop, changed = (rows[:, i] for i in range(header))
    returns: list[float] = []
    lengths: list[int] = []
    for row, count in zip(rows, episodes.astype(np.int64), strict=True):
        returns.extend(row[header : header + count])
        lengths.extend(row[header + EPISODES_PER_ROUND : header + EPISODES_PER_ROUND + count])
    return RoundOutcome(
        env_steps=int(steps.sum()),
        episode_returns=np.asarray(returns, dtype=np.float64),
        episode_lengths=np.asarray(lengths, dtype=np.int64),
        foreign_credit=float(foreign.sum()),
        all_ready=bool(ready.all()),
        stop=bool(stop.any()),
        state_changed=bool(changed[0]),
    )
