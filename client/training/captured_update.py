"""The whole DQN update as one function of device tensors, captured once in a CUDA graph.

One update, in the order it runs: draw a batch by priority from the replay
on the device (fedrl.client.training.device_replay), gather it (stacks
rebuilt from frames there), the learner's loss (the n-step Double DQN of
fedrl.client.training.learner, dueling heads in the network), backward,
gradient clip, Adam with capturable state and a learning rate held as a
device tensor, the new priorities written back, the target network moved
in place (`lerp_` by 1 when a hard update is due, by tau for Polyak, by 0
otherwise: no branch on a device value), and the counters and statistics
summed. The importance-sampling exponent beta is computed from the device's
update count, so its schedule needs no host either.

On CUDA the first updates run on a side stream (allocator, cuBLAS
workspaces and Adam's state settle), then `block` updates are captured
into one graph that every later call replays; a lone update for a count
that does not divide gets a graph of its own. Nothing in it waits for the
host, and the host reads the statistics back only when asked
(`start_readback`), through pinned memory without waiting. On the CPU the
very same functions run eagerly, which is how the tests check their math
against the host update (fedrl.client.training.learner.Learner._step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedrl.client.training.device_replay import DeviceBatch, DeviceReplay

WARMUP_UPDATES = 3
"""Updates run eagerly on a side stream before the first capture (PyTorch's recipe for
capturing a whole training step: lazy state is created outside the graph)."""


LossFn = Callable[[DeviceBatch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""The learner's loss of a batch: the loss, the batch's mean Q and each sample's |TD error|."""


class CapturedUpdate:
    """The device update of one learner: its networks, its Adam, its replay's device copy."""

    def __init__(
        self,
        *,
        online: nn.Module,
        target: nn.Module,
        optimizer: torch.optim.Optimizer,
        replay: DeviceReplay,
        loss: LossFn,
        batch_size: int,
        block: int,
        grad_clip_norm: float | None,
        tau: float,
        beta0: float,
        beta_anneal_updates: int,
        seed: int,
    ) -> None:
        """`tau` is how far a due target update moves (1 for a hard copy)."""
        device = replay.device
        self.device = device
        self._cuda = device.type == "cuda"
        self._online = list(online.parameters())
        self._target = list(target.parameters())
        self._optimizer = optimizer
        self._replay = replay
        self._loss = loss
        self._batch_size = batch_size
        self._block = block
        self._clip = grad_clip_norm
        self._tau = tau
        self._beta0 = beta0
        self._anneal = float(beta_anneal_updates)
        self._updates = torch.zeros((), dtype=torch.float64, device=device)
        self._since_target = torch.zeros((), dtype=torch.int64, device=device)
        self._period = torch.ones((), dtype=torch.int64, device=device)
        self._period_value = 1
        # Loss, mean Q and mean |TD error| summed over updates, and their count.
        self._statistics = torch.zeros(4, dtype=torch.float64, device=device)
        self._one = torch.ones((), dtype=torch.float64, device=device)
        self._host_statistics = torch.zeros(4, dtype=torch.float64, pin_memory=self._cuda)
        self._readback: torch.cuda.Event | None = None
        self._reading = False
        # A generator of its own, so the replay's draws follow the learner's seed and no
        # one else's; a CUDA graph advances it when it is registered with the graph.
        self._generator: torch.Generator | None = torch.Generator(device=device)
        if self._cuda and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
            self._generator = None  # an older torch: graphs draw from the default generator
        if self._generator is not None:
            self._generator.manual_seed(seed)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._warm = 0

    # -- the counters the host keeps in step ---------------------------------------

    def set_counters(self, *, updates: int, since_target: int, target_period: int) -> None:
        """Where the update counts from: total updates (beta's schedule), updates since the
        last target update, and the target period."""
        self._updates.fill_(updates)
        self._since_target.fill_(since_target)
        self.set_target_period(target_period)

    def set_target_period(self, period: int) -> None:
        """Updates between target updates from now on (the graph reads it, unchanged)."""
        if period != self._period_value:
            self._period.fill_(period)
            self._period_value = period

    def invalidate(self) -> None:
        """Forget the graphs: tensors they hold were replaced (Adam's state, on load or reset)."""
        self._graphs.clear()
        self._warm = 0

    # -- one update, as functions of device tensors ---------------------------------

    def beta(self) -> torch.Tensor:
        """beta0 annealed linearly to 1 over beta_anneal_updates, from the device's count."""
        progress = torch.clamp(self._updates / self._anneal, max=1.0)
        return self._beta0 + (1.0 - self._beta0) * progress

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch's slots and importance weights, drawn on the device."""
        return self._replay.draw(self._batch_size, beta=self.beta(), generator=self._generator)

    def update(self, slots: torch.Tensor, weights: torch.Tensor) -> None:
        """One gradient step on the transitions in `slots`, weighted by `weights`."""
        loss, q_mean, td_abs = self._loss(self._replay.gather(slots, weights))
        self._optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        if self._clip is not None:
            nn.utils.clip_grad_norm_(self._online, self._clip)
        self._optimizer.step()
        self._replay.write_back(slots, td_abs)
        self._updates += 1
        self._since_target += 1
        due = self._since_target >= self._period
        with torch.no_grad():
            weight = due.to(self._target[0].dtype) * self._tau
            for target, online in zip(self._target, self._online, strict=True):
                target.lerp_(online, weight)  # weight 1 gives online exactly; 0, target
        self._since_target.mul_(~due)
        self._statistics += torch.stack(
            [loss.detach().double(), q_mean.double(), td_abs.mean().double(), self._one]
        )

    # -- running it ----------------------------------------------------------------------

    def run(self, updates: int) -> None:
        """`updates` updates: graph replays on CUDA (queued, not waited for), eagerly elsewhere."""
        if not self._cuda:
            for _ in range(updates):
                self.update(*self.draw())
            return
        while updates and self._warm < WARMUP_UPDATES:
            self._warm_up()
            updates -= 1
        for count, times in ((self._block, updates // self._block), (1, updates % self._block)):
            if times:
                graph = self._graph(count)
                for _ in range(times):
                    graph.replay()

    def _warm_up(self) -> None:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self.update(*self.draw())
        current.wait_stream(side)
        self._warm += 1

    def _graph(self, count: int) -> torch.cuda.CUDAGraph:
        graph = self._graphs.get(count)
        if graph is None:
            graph = torch.cuda.CUDAGraph()
            if self._generator is not None:
                graph.register_generator_state(self._generator)
            with torch.cuda.graph(graph):
                for _ in range(count):
                    self.update(*self.draw())
            self._graphs[count] = graph
        return graph

    # -- statistics --------------------------------------------------------------------

    def start_readback(self) -> bool:
        """Queue a copy of the statistics summed so far to the host and start new sums;
        False (nothing done) while the previous copy has not been taken."""
        if self._reading:
            return False
        self._host_statistics.copy_(self._statistics, non_blocking=self._cuda)
        self._statistics.zero_()
        if self._cuda:
            self._readback = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._readback.record()
        self._reading = True
        return True

    def take_statistics(self, *, wait: bool = False) -> tuple[float, float, float, int] | None:
        """The last readback's mean loss, mean Q, mean |TD error| and update count, once it
        has arrived (at once with `wait`); None while it is on its way or none was started."""
        if not self._reading:
            return None
        if self._readback is not None:
            if not wait and not self._readback.query():  # type: ignore[no-untyped-call]
                return None
            self._readback.synchronize()
        self._reading = False
        loss, q_mean, td_mean, count = self._host_statistics.tolist()
        if count == 0:
            return None
        return loss / count, q_mean / count, td_mean / count, int(count)

    def synchronize(self) -> None:
        """Wait until every update queued so far has run."""
        if self._cuda:
            torch.cuda.synchronize(self.device)
