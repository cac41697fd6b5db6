"""The DQN learner: Double DQN, dueling heads, n-step targets and prioritized replay.

Read top to bottom: the loss (the paper's equations), then the Learner, which
samples, steps, writes priorities back and moves the target network. Its
knobs are fedrl.client.training.learner_config's. Collection happens
elsewhere; the caller feeds ``add`` and calls ``train`` at whatever replay
ratio it wants.

Two ways to run the same update: on the host replay (numpy sampling and
priorities, batches copied to the device: the CPU's way), or wholly on the
device (the replay mirrored there and the whole update captured in one CUDA
graph: fedrl.client.training.captured_update, CUDA's way by default).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedrl.client.training.captured_update import CapturedUpdate
from fedrl.client.training.cnn import is_image
from fedrl.client.training.config_changes import refuse_fixed_changes
from fedrl.client.training.device import resolve_device, to_cpu
from fedrl.client.training.device_replay import DeviceBatch, DeviceReplay
from fedrl.client.training.distributed import GradientSync
from fedrl.client.training.frame_replay import FrameStore, make_replay
from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.learner_config import (
    RECONFIGURABLE,
    TARGET_AT_ADOPTION,
    LearnerConfig,
    TargetAtAdoption,
)
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.q_network import (
    DEFAULT_NETWORK,
    build_q_network,
    load_named_arrays,
    named_arrays,
)
from fedrl.client.training.replay import Replay, ReplayStore, SampledBatch
from fedrl.client.training.symmetry import BatchSymmetries
from fedrl.client.training.transitions import LearnerTransitions

STATE_FORMAT = 1
"""Version of ``Learner.state_dict()``'s layout; bumped on any change to it."""
DEVICE_REPLAY_SHARE = 0.6
"""The most of a GPU's free memory whose replay copy `device_update` auto still takes; a
larger replay trains with the host update."""


def dqn_loss(  # noqa: PLR0917 (the contract keeps the paper's argument order)
    q_online: torch.Tensor,
    q_online_next: torch.Tensor | None,
    q_target_next: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    weights: torch.Tensor,
    *,
    double: bool,
    huber_delta: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The importance-weighted n-step (Double) DQN loss and each sample's |TD error|.

    q_* are [B, A] Q-values of obs (online) and next_obs (online, target);
    rewards already sum k discounted steps and discounts are gamma**k, or 0
    where the episode terminated, so no bootstrap crosses an episode's end.
    q_online_next is only needed (and only read) when ``double``.
    """
    q_taken = q_online.gather(1, actions.unsqueeze(1)).squeeze(1)  # Q(s, a)
    with torch.no_grad():
        if double:  # van Hasselt et al. 2016: a* = argmax_a Q_online(s', a)
            if q_online_next is None:
                raise ValueError("Double DQN needs q_online_next, the online net's Q(s', .)")
            next_actions = q_online_next.argmax(dim=1, keepdim=True)
            next_value = q_target_next.gather(1, next_actions).squeeze(1)  # Q_target(s', a*)
        else:  # Mnih et al. 2015: max_a Q_target(s', a)
            next_value = q_target_next.max(dim=1).values
        target = rewards + discounts * next_value  # y = R^(k) + gamma^k * V(s')
    td_error = target - q_taken
    if huber_delta is None:
        per_sample = 0.5 * td_error.square()
    else:
        per_sample = nn.functional.huber_loss(q_taken, target, reduction="none", delta=huber_delta)
    loss = (weights * per_sample).mean()  # PER: w_i corrects the sampling bias
    return loss, td_error.detach().abs()


@dataclass(frozen=True)
class PendingWeights:
    """The online network's weights on their way to the host (Learner.weights_later)."""

    arrays: list[tuple[str, np.ndarray]]
    """Named float32 arrays, as Learner.weights gives them: read them once `arrived()`."""
    updates: int
    """The learner's update count whose weights these are."""
    ready: torch.cuda.Event | None

    def arrived(self) -> bool:
        return self.ready is None or bool(self.ready.query())  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class _PendingPriorities:
    """|TD errors| still on their way to the host, and the slots they belong to."""

    indices: np.ndarray
    td_abs: torch.Tensor
    ready: torch.cuda.Event | None


class Learner:
    """Owns the online and target Q-networks, the optimizer and the replay.

    Not thread-safe: the owner calls add and train in turn.
    """

    def __init__(
        self,
        *,
        obs_shape: tuple[int, ...],
        n_actions: int,
        config: LearnerConfig,
        replay: Replay | None = None,
        network: NetworkConfig = DEFAULT_NETWORK,
        gradients: GradientSync | None = None,
        action_mask: bool = False,
        symmetries: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """`network` picks the torso (fedrl.client.training.networks): the MLP of
        config.hidden by default, or the causal transformer. `gradients` makes
        this learner one rank of several (fedrl.client.training.distributed):
        every step then uses the ranks' mean gradient. `action_mask`: observations
        end with the legal-action mask, which the networks apply to their
        Q-values, so the target's max and Double DQN's argmax see legal actions
        only (fedrl.client.training.masking). `symmetries`: a board game's
        (GameRules.symmetries), in which each drawn transition is trained on
        (fedrl.client.training.symmetry) unless config.symmetries is off."""
        self.config = config
        self._gradients = gradients
        self.obs_shape = tuple(obs_shape)
        # Images stay uint8 up to the network, which scales them on the device.
        self.obs_dtype = np.dtype(np.uint8 if is_image(self.obs_shape) else np.float32)
        self.n_actions = n_actions
        self.device = resolve_device(config.device)
        self._cuda = self.device.type == "cuda"
        self._amp = config.amp and self._cuda
        # A local RNG scope: seeding the network must not reseed the caller's torch.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            q_network = build_q_network(
                self.obs_shape,
                n_actions,
                hidden=config.hidden,
                dueling=config.dueling,
                network=network,
                action_mask=action_mask,
            )
        self.online: nn.Module = q_network.to(self.device)
        self.target: nn.Module = copy.deepcopy(self.online).requires_grad_(False)
        on_device = self._updates_on_device(config, replay, gradients)
        # Fused Adam is one kernel for all parameters: on CUDA that removes
        # ~a dozen launches per step, which is most of a small network's step.
        # The device update's is capturable, its learning rate a device tensor
        # that reconfigure changes in place under the captured graph.
        self._lr = torch.tensor(config.lr, device=self.device) if on_device else None
        self.optimizer = torch.optim.Adam(
            self.online.parameters(),
            lr=config.lr if self._lr is None else self._lr,
            fused=True,
            capturable=on_device,
        )
        self._optimizer_flags = [
            {k: g[k] for k in ("foreach", "fused", "capturable") if k in g}
            for g in self.optimizer.param_groups
        ]
        # Injectable so experience exchange can mix foreign transitions in.
        # (`replay or ...` would not do: an empty replay is falsy.)
        if replay is None:
            replay = make_replay(
                config.replay_capacity,
                self.obs_shape,
                prioritized=config.prioritized,
                alpha=config.alpha,
                eps=config.priority_eps,
                seed=config.seed,
            )
        self.replay: Replay = replay
        self.updates = 0
        self._data_multiple = 1.0
        self._target_updated_at = 0
        self._loss_fn: Callable[[DeviceBatch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = (
            torch.compile(self._loss) if config.compile else self._loss
        )
        # A board game's symmetries (GameRules.symmetries), drawn per sample inside the loss,
        # so the host update and the captured device update transform alike.
        self._symmetries = (
            BatchSymmetries(
                *symmetries,
                obs_features=math.prod(self.obs_shape),
                n_actions=n_actions,
                device=self.device,
            )
            if symmetries is not None and config.symmetries
            else None
        )
        self._captured: CapturedUpdate | None = None
        self._unread = 0  # device updates whose statistics no readback has taken yet
        if on_device:
            assert isinstance(replay, ReplayStore)
            self._captured = CapturedUpdate(
                online=self.online,
                target=self.target,
                optimizer=self.optimizer,
                replay=replay.mirror_on(self.device),
                loss=self._loss_fn,
                batch_size=config.batch_size,
                block=config.sample_block,
                grad_clip_norm=config.grad_clip_norm,
                tau=1.0 if config.target_update == "hard" else config.polyak_tau,
                beta0=config.beta0,
                beta_anneal_updates=config.beta_anneal_updates,
                seed=config.seed,
            )
            self._restart_target_schedule()

    def _updates_on_device(
        self, config: LearnerConfig, replay: Replay | None, gradients: GradientSync | None
    ) -> bool:
        """Whether this learner runs the device update (LearnerConfig.device_update)."""
        if config.device_update == "off":
            return False
        fits = gradients is None and (replay is None or isinstance(replay, ReplayStore))
        if config.device_update == "auto":
            return self._cuda and fits and self._replay_fits_the_device(config, replay)
        if not fits:
            raise ValueError(
                "device_update on needs one learner (no data-parallel ranks) over the replay "
                "it builds or a PrioritizedReplay / FrameReplay; use device_update off"
            )
        return True

    def _replay_fits_the_device(self, config: LearnerConfig, replay: Replay | None) -> bool:
        """Whether the replay's device copy takes at most DEVICE_REPLAY_SHARE of the
        device's free memory (the rest is for the networks, Adam and the graphs)."""
        capacity, obs_shape = config.replay_capacity, self.obs_shape
        if isinstance(replay, ReplayStore):
            capacity, obs_shape = replay.capacity, replay.obs_shape
        stack = obs_shape[0] if is_image(obs_shape) else None
        needed = DeviceReplay.bytes_for(capacity, obs_shape, stack=stack)
        free, _ = torch.cuda.mem_get_info(self.device)
        return needed <= DEVICE_REPLAY_SHARE * free

    @property
    def on_device(self) -> bool:
        """Whether updates run wholly on the device (replay mirrored there, one CUDA graph)."""
        return self._captured is not None

    # -- experience ---------------------------------------------------------

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None:
        """Store transitions (checked: shapes, dtypes, finite values, action range)."""
        batch.validate(self.obs_shape, self.obs_dtype)
        if len(batch) and batch.action.max() >= self.n_actions:
            raise ValueError(
                f"action {batch.action.max()} out of range for {self.n_actions} actions"
            )
        self.replay.add(batch, foreign=foreign)

    def add_frames(
        self, streams: np.ndarray, segment: FrameSegment, *, rebuild: bool = False
    ) -> LearnerTransitions | None:
        """Store a frame actor's segment (checked as `add` checks transitions).

        With `rebuild`, returns the transitions stored, stacks and all, ordered
        by stream and step (for experience exchange); else None.
        """
        if not isinstance(self.replay, FrameStore):
            raise TypeError("frame segments need a replay that keeps frames (a FrameReplay)")
        segment.validate(self.obs_shape[1:])
        if len(segment) and segment.action.max() >= self.n_actions:
            raise ValueError(
                f"action {segment.action.max()} out of range for {self.n_actions} actions"
            )
        slots = self.replay.add_frames(streams, segment)
        return self.replay.transitions(slots) if rebuild else None

    def ready(self) -> bool:
        """Whether the replay holds enough transitions to start training."""
        return len(self.replay) >= max(1, self.config.learning_starts)

    def beta(self) -> float:
        """The importance-sampling exponent now: beta0 annealed linearly to 1."""
        progress = min(1.0, self.updates / self.config.beta_anneal_updates)
        return self.config.beta0 + (1.0 - self.config.beta0) * progress

    # -- training -----------------------------------------------------------

    def train(self, num_updates: int) -> dict[str, float]:
        """Run num_updates gradient steps; return their mean loss, Q and |TD error|.

        Batches are drawn sample_block updates at a time and their priorities
        written back a block later, so on CUDA the host never waits for the
        GPU inside the loop; the one wait is for the statistics at the end.
        A draw can thus be up to two blocks stale; Ape-X tolerates far more.
        """
        if num_updates < 1:
            raise ValueError(f"num_updates must be at least 1, got {num_updates}")
        if not self.ready():
            raise RuntimeError(
                f"replay holds {len(self.replay)} transitions; training starts at "
                f"{self.config.learning_starts} (check ready() first)"
            )
        if self._captured is not None:
            return self._train_on_device(self._captured, num_updates)
        sums = torch.zeros(3, device=self.device)  # loss, q_mean, td_abs_mean
        pending: _PendingPriorities | None = None
        done = 0
        while done < num_updates:
            block = min(self.config.sample_block, num_updates - done)
            sampled = self.replay.sample(block * self.config.batch_size, self.beta())
            batches, indices = self._to_device(sampled, block)
            td_block = []
            for batch in batches:
                loss, q_mean, td_abs = self._step(batch)
                sums += torch.stack([loss, q_mean, td_abs.mean()])
                td_block.append(td_abs)
            # The previous block's |TD errors| have had a whole block of GPU
            # work to arrive; write them back now, then queue this block's.
            self._write_priorities(pending)
            pending = self._start_priority_transfer(indices, torch.stack(td_block))
            done += block
        self._write_priorities(pending)
        loss_mean, q_mean, td_mean = (sums / num_updates).tolist()
        return {
            "loss": loss_mean,
            "q_mean": q_mean,
            "td_abs_mean": td_mean,
            "updates": float(self.updates),
            "beta": self.beta(),
        }

    def _train_on_device(self, captured: CapturedUpdate, num_updates: int) -> dict[str, float]:
        """Queue the updates on the device; the statistics only when a readback has arrived.

        The host keeps the target schedule's count as the device does, by
        the same rule, so that state_dict and reconfigure see where it is.
        """
        captured.run(num_updates)
        period = self.target_period()
        for _ in range(num_updates):
            self.updates += 1
            if self.updates - self._target_updated_at >= period:
                self._target_updated_at = self.updates
        self._unread += num_updates
        if self._unread >= self.config.stats_interval and captured.start_readback():
            self._unread = 0
        return self._statistics(captured.take_statistics())

    def _statistics(self, read: tuple[float, float, float, int] | None) -> dict[str, float]:
        if read is None:
            return {}
        loss, q_mean, td_mean, _ = read
        if not (math.isfinite(loss) and math.isfinite(td_mean)):
            raise FloatingPointError(
                f"the DQN update diverged (non-finite loss or TD error by {self.updates} "
                "updates); lower lr, or enable huber_delta / grad_clip_norm"
            )
        return {
            "loss": loss,
            "q_mean": q_mean,
            "td_abs_mean": td_mean,
            "updates": float(self.updates),
            "beta": self.beta(),
        }

    def synchronize(self) -> dict[str, float]:
        """Wait for every queued update; the statistics of those not yet reported.

        For a clock that counts work done (benchmarks, `fedrl-client check`);
        the host update never leaves work queued.
        """
        if self._captured is None:
            return {}
        self._captured.synchronize()
        pending = self._captured.take_statistics(wait=True)
        if self._unread and self._captured.start_readback():
            self._unread = 0
            pending = self._captured.take_statistics(wait=True)
        return self._statistics(pending)

    def _step(self, batch: DeviceBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One gradient step, then the target update when it is due."""
        loss, q_mean, td_abs = self._loss_fn(batch)
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        if self._gradients is not None:
            # Before clipping: the ranks clip their common mean, as one learner
            # clips the gradient of its whole batch.
            self._gradients.average_gradients(self.online.parameters())
        if self.config.grad_clip_norm is not None:
            nn.utils.clip_grad_norm_(self.online.parameters(), self.config.grad_clip_norm)
        self.optimizer.step()
        self.updates += 1
        if self.updates - self._target_updated_at >= self.target_period():
            self._update_target()
            self._target_updated_at = self.updates
        return loss.detach(), q_mean, td_abs

    def target_period(self) -> int:
        """Updates between target updates: target_update_interval, longer for a data-rich learner.

        A learner fed by others' experience makes more updates per env step of
        its own, and with a fixed period its bootstrap target would move that
        much faster against the same policy's data. So the period grows with the
        data multiple (transitions credited per own env step, set_data_multiple)
        to the power target_period_data_exponent. Alone the multiple is 1, and
        the run is the one it would be offline. The exponent's default:
        docs/benchmarks.md, target period.
        """
        scale = math.pow(self._data_multiple, self.config.target_period_data_exponent)
        return max(1, round(self.config.target_update_interval * scale))

    def set_data_multiple(self, multiple: float) -> None:
        """Tell the learner how many transitions it takes in per env step of its own (>= 1)."""
        if not (math.isfinite(multiple) and multiple >= 1.0):
            raise ValueError(f"the data multiple must be finite and >= 1, got {multiple}")
        self._data_multiple = multiple
        if self._captured is not None:
            self._captured.set_target_period(self.target_period())

    def _loss(self, batch: DeviceBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward passes and dqn_loss: the part torch.compile may fuse."""
        if self._symmetries is not None:
            batch = self._symmetries.apply(batch)
        double = self.config.double_dqn
        # bf16 matmuls, float32 loss: the TD error is a small difference of large
        # values, which bf16's 8-bit mantissa would round away. A CUDA graph must
        # not keep autocast's cache of cast weights: it would replay stale ones.
        with torch.autocast(
            self.device.type,
            dtype=torch.bfloat16,
            enabled=self._amp,
            cache_enabled=self._captured is None,
        ):
            q_online = self.online(batch.obs).float()
            with torch.no_grad():
                q_online_next = self.online(batch.next_obs).float() if double else None
                q_target_next = self.target(batch.next_obs).float()
        loss, td_abs = dqn_loss(
            q_online,
            q_online_next,
            q_target_next,
            batch.action,
            batch.reward,
            batch.discount,
            batch.weights,
            double=double,
            huber_delta=self.config.huber_delta,
        )
        # The greedy action's value, max_a Q(s, a) (Mnih et al. 2015's "average predicted
        # action-value"): a masked illegal action's Q-value never enters it.
        return loss, q_online.detach().amax(dim=1).mean(), td_abs

    @torch.no_grad()
    def _update_target(self) -> None:
        # Hard is Polyak with tau = 1: theta_target <- theta_target + tau (theta - theta_target).
        tau = 1.0 if self.config.target_update == "hard" else self.config.polyak_tau
        for target, online in zip(self.target.parameters(), self.online.parameters(), strict=True):
            target.lerp_(online, tau)

    def _to_device(self, sampled: SampledBatch, block: int) -> tuple[list[DeviceBatch], np.ndarray]:
        """Split a drawn block into per-update batches and move them to the device.

        A stratified draw of block*B is split by striding (update k takes draws
        k, k+block, ...), so every update's batch still spans the whole
        priority range. Returns [block, B, ...] tensors and [block, B] slots.
        """
        size = self.config.batch_size

        def per_update(array: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(array.reshape(size, block, *array.shape[1:]).swapaxes(0, 1))

        batch = sampled.batch
        arrays = (
            batch.obs,
            batch.action,
            batch.reward,
            batch.next_obs,
            batch.discount,
            sampled.weights,
        )
        columns = [self._upload(per_update(array)) for array in arrays]
        batches = [DeviceBatch(*(column[k] for column in columns)) for k in range(block)]
        return batches, per_update(sampled.indices)

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if not self._cuda:
            return tensor
        # Pinned host memory lets the copy run asynchronously with compute;
        # torch's caching host allocator keeps the buffer alive until it is done.
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _start_priority_transfer(
        self, indices: np.ndarray, td_abs: torch.Tensor
    ) -> _PendingPriorities:
        if not self._cuda:
            return _PendingPriorities(indices, td_abs, None)
        # non_blocking to the CPU lands in pinned memory; the event says when.
        host = td_abs.to("cpu", non_blocking=True)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
        return _PendingPriorities(indices, host, ready)

    def _write_priorities(self, pending: _PendingPriorities | None) -> None:
        if pending is None:
            return
        if pending.ready is not None:
            pending.ready.synchronize()
        td_abs = pending.td_abs.float().numpy()
        if not np.all(np.isfinite(td_abs)):
            raise FloatingPointError(
                f"the DQN update diverged (non-finite TD error after {self.updates} updates); "
                "lower lr, or enable huber_delta / grad_clip_norm"
            )
        self.replay.update_priorities(pending.indices.ravel(), td_abs.ravel())

    # -- weights and state --------------------------------------------------

    def weights(self) -> list[tuple[str, np.ndarray]]:
        """The online network as named float32 CPU arrays (for actors and federation)."""
        return named_arrays(self.online)

    def weights_later(self) -> PendingWeights:
        """The weights `weights()` would give, copied to the host behind the updates queued on
        CUDA (into pinned memory, not waited for) rather than after waiting for them."""
        if not self._cuda:
            return PendingWeights(self.weights(), self.updates, None)
        arrays = []
        for name, param in self.online.named_parameters():
            host = torch.empty(param.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(param.detach(), non_blocking=True)
            arrays.append((name, host.numpy()))
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
        return PendingWeights(arrays, self.updates, ready)

    def set_weights(
        self, arrays: Sequence[tuple[str, np.ndarray]], *, target: TargetAtAdoption = "reset"
    ) -> None:
        """Adopt a model (e.g. the newest global one); strict about names and shapes.

        What the target network does decides what the next TD targets
        bootstrap from: "reset" copies the new model (a fresh start, as after
        loading a checkpoint), "keep" leaves it as it was, "shift" moves it by
        the same change as the online net so that its lag behind the online
        net is kept. Federated adoption shifts by default: the change it
        applies is the other participants' progress, and a DQN whose target
        jumps to the online net at every adoption (every few episodes) loses
        its stable bootstrap (docs/benchmarks.md, target at adoption). Adam's
        moments are kept in every case; they describe the loss surface, which
        a nearby model shares.
        """
        if target not in TARGET_AT_ADOPTION:
            raise ValueError(
                f"target must be one of {', '.join(TARGET_AT_ADOPTION)}, got {target!r}"
            )
        before = [p.detach().clone() for p in self.online.parameters()] if target == "shift" else []
        load_named_arrays(self.online, arrays)
        with torch.no_grad():
            if target == "reset":
                for old_target, online in zip(
                    self.target.parameters(), self.online.parameters(), strict=True
                ):
                    old_target.copy_(online)
            elif target == "shift":
                for old_target, old_online, online in zip(
                    self.target.parameters(), before, self.online.parameters(), strict=True
                ):
                    old_target.add_(online - old_online)

    def reconfigure(self, config: LearnerConfig) -> None:
        """Take new values of the knobs a running learner can change (population-based training).

        The learning rate reaches the optimizer at once and the target
        interval counts from the next update; gamma lives in the actors'
        n-step returns (the engine restarts them). Any other field must stay.
        """
        refuse_fixed_changes(self.config, config, RECONFIGURABLE, algorithm="DQN")
        self.config = config
        self._restart_target_schedule()
        if self._lr is not None:
            self._lr.fill_(config.lr)  # read by the captured graph where it lies
            return
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr

    def reset_optimizer(self) -> None:
        """Forget Adam's moments and step counts, e.g. after copying another member's weights."""
        self.optimizer.state.clear()
        if self._captured is not None:
            self._captured.invalidate()  # the graphs hold the old state's tensors

    def state_dict(self) -> dict[str, Any]:
        """Online, target, optimizer and counters, all on CPU.

        Only tensors, numbers, strings and containers: loadable with
        ``torch.load(weights_only=True)`` on any machine, GPU or not.
        """
        optimizer = to_cpu(self.optimizer.state_dict())
        if self._lr is not None:  # the device update's is a tensor: saved as the number it holds
            for group in optimizer["param_groups"]:
                group["lr"] = self.config.lr
        return {
            "format": STATE_FORMAT,
            "online": to_cpu(self.online.state_dict()),
            "target": to_cpu(self.target.state_dict()),
            "optimizer": optimizer,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict saved; ValueError if it is not such a dict."""
        missing = {"format", "online", "target", "optimizer", "updates"} - set(state)
        if missing:
            raise ValueError(f"learner state is missing {sorted(missing)}")
        if state["format"] != STATE_FORMAT:
            raise ValueError(f"learner state has format {state['format']}, expected {STATE_FORMAT}")
        optimizer_state = dict(state["optimizer"])
        # Keep this machine's kernel choice (fused on CUDA): a checkpoint
        # written on a GPU must restore on a CPU and the other way round.
        optimizer_state["param_groups"] = [
            {**group, **flags}
            for group, flags in zip(
                optimizer_state["param_groups"], self._optimizer_flags, strict=True
            )
        ]
        # Check everything before writing anything, so a bad file changes nothing.
        _check_fits("online", self.online, state["online"])
        _check_fits("target", self.target, state["target"])
        try:
            self.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError) as error:
            raise ValueError(
                f"learner state's optimizer does not fit this network: {error}"
            ) from error
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.updates = int(state["updates"])
        if self._lr is not None:
            for group in self.optimizer.param_groups:
                self._lr.fill_(float(group["lr"]))
                group["lr"] = self._lr
        if self._captured is not None:
            self._captured.invalidate()  # Adam's state tensors are new ones
        self._restart_target_schedule()

    def _restart_target_schedule(self) -> None:
        """Count the next target period from the last multiple of the interval.

        Without others' data that is where a learner counting from update 0
        last updated its target, so a restored or reconfigured lone learner
        keeps the schedule it had.
        """
        interval = self.config.target_update_interval
        self._target_updated_at = self.updates - self.updates % interval
        if self._captured is not None:
            self._captured.set_counters(
                updates=self.updates,
                since_target=self.updates - self._target_updated_at,
                target_period=self.target_period(),
            )


def _check_fits(what: str, module: nn.Module, saved: dict[str, Any]) -> None:
    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in saved.items() if isinstance(t, torch.Tensor)}
    if expected != got:
        differing = sorted(set(expected.items()) ^ set(got.items()))
        raise ValueError(f"learner state's {what} network does not fit this one: {differing[:4]}")
