"""Weight sync: the participant's progress pushed as weight deltas, the global model adopted back.

Two halves, one per thread. `WeightSync` runs in the main thread, between
the engine's rounds; `WeightTraffic` (fedrl.client.federation.weight_traffic)
is its task on the network thread (fedrl.client.federation.server_link).
They meet in three places only: the durable outbox (main thread writes,
network thread sends and deletes), a "sendable through" sequence number, and
a slot holding the newest pulled global model, which the main thread adopts
at its next round.

Every sync interval (`SyncInterval`: so many local episodes or env steps;
PPO: after every rollout update, the unit of its progress), once the
previous update has been acknowledged (one in flight at a time, so a slow
link or the server's rate limit makes updates larger, not late), the main
thread:

1. takes an INCREMENTAL delta, local − reference, where the reference is the
   weights at the last push or adoption (a delta from the last adopted
   global would resend the previous push's progress when no new global
   arrived in between, counting it twice), writes it to the outbox
   with the counts since the last push and the metrics, then records the new
   reference in the sync state file, and only then lets the network thread
   send it;
2. adopts a newer global version g if the network thread pulled one (it
   pulls as soon as the link hears of a new version): the new reference is
   g plus this participant's deltas that g does not hold yet (the server
   says which it holds: `applied_sequence`), and local moves by the change
   of reference, the others' progress (`rebase`). What was learned since the
   last push and not yet sent stays in local − reference, so adoption loses
   no local work.
   The learner's target network is shifted by the same change as the online
   net by default (`target_at_adoption` also offers reset and keep). The
   optimizer state (Adam's moments) is kept: it describes the loss surface
   around a nearby model, and resetting it would restart Adam's bias
   correction with oversized first steps after every sync.
3. at the end (the session goal, the run's budget, Ctrl-C) pushes the
   remaining progress and waits, bounded, for its acknowledgement
   (`finish`); the caller saves.

Refused updates. An update the server refuses as too stale (FAILED_PRECONDITION
after a rejoin, e.g. a backlog after a long outage) is handed back by the
outbox; the main thread subtracts its delta from the reference and its
counts from the pushed counters, so its progress and its episodes leave
again with the next update, based on a newer version. Any other refusal (a
malformed update: a bug) is logged and kept in the outbox's rejected/ folder.

Crash safety. The sync state file (fedrl.client.federation.sync_state) is
written after each outbox entry and each adoption, and read back at start:

- if the autosaved model is not newer than the sync state (by episodes), the
  sync state's local weights and counters win, so the reference and the
  local model always belong together;
- an outbox entry past the state's sequence (a crash between writing the
  entry and the state) is folded into the reference, so its delta is not
  sent again inside the next one;
- a handed-back update is taken back unless the state lists its sequence as
  taken back already (a crash before its file was deleted).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fedrl.client.federation.errors import RejectedError, UnavailableError
from fedrl.client.federation.event_record import event_record
from fedrl.client.federation.federation_client import (
    GlobalModel,
    build_update,
)
from fedrl.client.federation.global_scoring import GlobalScoring, VersionScore
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.outbox_file import Entry
from fedrl.client.federation.server_link import ServerLink
from fedrl.client.federation.sync_interval import SyncInterval
from fedrl.client.federation.sync_state import (
    InFlight,
    NamedArrays,
    SyncState,
    load_sync_state,
    save_sync_state,
)
from fedrl.client.federation.update_entries import UPDATE, decode_update
from fedrl.client.federation.weight_traffic import WeightTraffic
from fedrl.client.training.counters import PollResult
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.learner_config import TARGET_AT_ADOPTION, TargetAtAdoption
from fedrl.common.group_rules import DELTA_DTYPES
from fedrl.common.serde import wire_dtype
from fedrl.proto.v1 import federation_pb2 as pb

log = logging.getLogger(__name__)


class WeightSync:
    """The main thread's half: pushes the engine's progress and adopts global models."""

    def __init__(
        self,
        engine: TrainingEngine,
        *,
        state_path: Path,
        participant_id: str,
        session: str,
        spec_hash: str,
        sync_interval: SyncInterval,
        delta_dtype: str,
        evaluate_global: bool,
        target_at_adoption: TargetAtAdoption,
        on_record: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        if target_at_adoption not in TARGET_AT_ADOPTION:
            raise ValueError(
                f"target_at_adoption must be one of {', '.join(TARGET_AT_ADOPTION)}, "
                f"got {target_at_adoption!r}"
            )
        if delta_dtype not in DELTA_DTYPES:
            raise ValueError(
                f"delta dtype must be one of {', '.join(DELTA_DTYPES)}, got {delta_dtype!r}"
            )
        self._engine = engine
        self.state_path = state_path
        self._participant_id = participant_id
        self._session = session
        self._spec_hash = spec_hash
        self._sync_interval = sync_interval
        self._delta_dtype = wire_dtype(delta_dtype)
        self._evaluate_global = evaluate_global
        self._target_at_adoption: TargetAtAdoption = target_at_adoption
        self._on_record = on_record
        self._state: SyncState | None = None
        self._link: ServerLink | None = None
        self._outbox: Outbox | None = None
        self._traffic: WeightTraffic | None = None
        self._returns: list[float] = []
        self._losses: list[float] = []
        self._eval_since_push: float | None = None
        self._scoring: GlobalScoring | None = None
        self._last_score: VersionScore | None = None
        self._unreported_score: VersionScore | None = None
        self._taken_back_count = 0
        self._pushed_at = -math.inf
        """When the last update was queued (monotonic): pushes keep the server's pace."""

    def attach(self, link: ServerLink, outbox: Outbox) -> None:
        """Restore the sync state (module docstring), then send and pull through the link."""
        self._link = link
        self._outbox = outbox
        state = self._restore(outbox)
        self._traffic = WeightTraffic(link, outbox, seed_weights=state.local)
        self._traffic.release(state.sequence)
        if self._evaluate_global and self._engine.config.eval_episodes:
            self._scoring = GlobalScoring(
                self._engine.scorer(self._engine.config.eval_episodes),
                interval_env_steps=link.view.session.global_eval_interval,
            )

    def _restore(self, outbox: Outbox) -> SyncState:
        """Reconcile the sync state, the outbox and the autosaved model (module docstring)."""
        counters = self._engine.counters
        state = load_sync_state(self.state_path)
        if state is None:
            state = self._nothing_to_push(self._engine.weights())
        for entry in outbox.pending(UPDATE):
            if entry.sequence > state.sequence:
                header, delta = decode_update(entry)
                log.info(
                    "folding update %d into the reference (written before a crash)", entry.sequence
                )
                reference = _plus(state.reference, delta)
                state = replace(
                    state,
                    sequence=entry.merged_through,
                    reference=reference,
                    local=reference,
                    in_flight=(*state.in_flight, InFlight(entry.sequence, delta)),
                    pushed_episodes=state.pushed_episodes + header.episodes,
                    pushed_env_steps=state.pushed_env_steps + header.env_steps,
                    saved_episodes=state.pushed_episodes + header.episodes,
                    saved_env_steps=state.pushed_env_steps + header.env_steps,
                )
        if counters.episodes <= state.saved_episodes and state.saved_episodes > 0:
            # The autosaved model is older than the sync state: take the model
            # the reference belongs to, and the counters it was written with.
            log.info("resuming from the sync state's model at episode %d", state.saved_episodes)
            self._engine.set_weights(state.local)
            self._engine.restore_counters(
                replace(counters, episodes=state.saved_episodes, env_steps=state.saved_env_steps)
            )
        self._state = state
        self._take_back_returned()
        return self._state

    def _take_back(self, state: SyncState, entry: Entry) -> SyncState:
        """Put a refused update's progress back into local − reference, and its counts."""
        header, delta = decode_update(entry)
        log.warning(
            "update %d (%d episodes) was refused as too stale; its progress goes into the "
            "next update",
            entry.sequence,
            header.episodes,
        )
        return replace(
            state,
            reference=_minus(state.reference, delta),
            in_flight=tuple(p for p in state.in_flight if p.sequence != entry.sequence),
            pushed_episodes=state.pushed_episodes - header.episodes,
            pushed_env_steps=state.pushed_env_steps - header.env_steps,
            taken_back=(*state.taken_back, entry.sequence),
        )

    def _take_back_returned(self) -> None:
        assert self._state is not None and self._outbox is not None
        returned = self._outbox.returned(UPDATE)
        state = self._state
        for entry in returned:
            if entry.sequence not in state.taken_back:
                state = self._take_back(state, entry)
        self._state = state
        save_sync_state(self.state_path, state)
        for entry in returned:
            self._outbox.forget_returned(UPDATE, entry.sequence)

    # Every round.

    def after_poll(self, result: PollResult) -> None:
        """Record the round; push when the interval is full; adopt a pulled global model."""
        assert self._outbox is not None
        self.observe(result)
        paced = self.pace_left_s() == 0.0
        if self.due(result) and paced and not self._outbox.pending(UPDATE):
            # One update in flight at a time: while the previous one waits
            # (a slow link, the server's rate limit, an outage) the progress
            # keeps growing in local − reference and leaves as one fresher
            # update, instead of a queue of deltas on ever older bases that
            # the global model would take in late.
            self.push()

    def observe(self, result: PollResult) -> None:
        """Record the round's returns and losses; adopt what the server handed over since."""
        assert self._state is not None
        self._returns.extend(result.episode_returns)
        if "loss" in result.train_metrics:
            self._losses.append(result.train_metrics["loss"])
        if result.evaluation is not None:
            self._eval_since_push = result.evaluation.mean
        self._absorb()

    def set_mode(self, sync_interval: SyncInterval, delta_dtype: str) -> None:
        """Sync on this interval and push deltas of this type from now on (SyncLoop, as the
        session's size moves between rounds and asynchronous syncs)."""
        self._sync_interval = sync_interval
        self._delta_dtype = wire_dtype(delta_dtype)

    def due(self, result: PollResult) -> bool:
        """Whether the sync interval is full (PPO: the round made a rollout update)."""
        if self._engine.on_policy:
            return result.policy_updates > 0
        return self._sync_interval.due(
            episodes=self.unpushed_episodes,
            env_steps=self.unpushed_env_steps,
            total_env_steps=self._engine.counters.env_steps,
        )

    def pace_left_s(self) -> float:
        """Seconds until a push keeps within the server's rate limit (0: it may go now)."""
        spacing = self._require_link().view.push_spacing_s
        return max(0.0, self._pushed_at + spacing - time.monotonic())

    def push_when_sent(self, timeout_s: float) -> int | None:
        """Push once the previous update is acknowledged, waiting up to `timeout_s` for that;
        its sequence, or None (nothing to push, or the previous one still unacknowledged: its
        progress then leaves with a later push)."""
        assert self._outbox is not None
        if self._outbox.pending(UPDATE) and not self._require_traffic().flush(timeout_s):
            return None
        return self.push()

    def await_first_version(self, timeout_s: float) -> bool:
        """Before the first adoption: wait up to `timeout_s` for a global version and adopt
        it; whether one is adopted now (at once if one already was)."""
        if self.base_version < 0:
            self._require_traffic().wait_for_any_version(timeout_s)
            self._absorb()
        return self.base_version >= 0

    def await_version(self, sequence: int, timeout_s: float) -> bool:
        """Wait until the server's version holding update `sequence` is pulled, and adopt it.

        False when it did not come within `timeout_s` (a member slower than
        that, the server unreachable, the update handed back): training goes
        on, and the version is adopted at a later round as usual.
        """
        held = self._require_traffic().wait_for_version(sequence, timeout_s)
        self._absorb()
        return held

    def _absorb(self) -> None:
        """Take back updates the server handed back; adopt a newly pulled global model; collect
        the scores of global versions that finished."""
        traffic = self._require_traffic()
        given_back = traffic.given_back
        if given_back != self._taken_back_count:
            self._taken_back_count = given_back
            self._take_back_returned()
        model = traffic.take_pending()
        if model is not None:
            self._adopt(model)
        if self._scoring is not None:
            self._scoring.set_interval(self._require_link().view.session.global_eval_interval)
            for score in self._scoring.take_scores():
                self._last_score = self._unreported_score = score
                self._record("score", version=score.version, global_eval=score.mean_return)

    def push(self) -> int | None:
        """Write the progress since the last push to the outbox; its sequence, or None if none."""
        assert self._state is not None and self._outbox is not None
        state = self._state
        counters = self._engine.counters
        env_steps = counters.env_steps - state.pushed_env_steps
        if not self._engine.learns:
            # An acting-only participant has no progress of its own: its model
            # is the global one, and its contribution is its experience.
            return None
        if state.base_version < 0 or env_steps <= 0:
            # Never synced: the progress stays in local − reference and goes
            # out with the first push after the first adoption.
            return None
        local = self._engine.weights()
        delta = [(n, w - r) for (n, w), (_, r) in zip(local, state.reference, strict=True)]
        metrics = self._metrics()
        episodes = counters.episodes - state.pushed_episodes
        entry = self._outbox.add(
            UPDATE,
            lambda sequence: [
                m.SerializeToString()
                for m in build_update(
                    session=self._session,
                    participant_id=self._participant_id,
                    sequence=sequence,
                    base_version=state.base_version,
                    env_steps=env_steps,
                    episodes=episodes,
                    samples=env_steps,
                    metrics=metrics,
                    spec_hash=self._spec_hash,
                    delta=delta,
                    dtype=self._delta_dtype,
                )
            ],
        )
        # The reference moves by the delta as the server will decode it, not to
        # the local model: what bf16 rounding left out stays in local − reference
        # and leaves with the next push (error feedback), and a version holding
        # only this push then equals the reference exactly.
        _, wire = decode_update(entry)
        self._state = replace(
            state,
            sequence=entry.sequence,
            pushed_episodes=counters.episodes,
            pushed_env_steps=counters.env_steps,
            saved_episodes=counters.episodes,
            saved_env_steps=counters.env_steps,
            reference=_plus(state.reference, wire),
            local=local,
            in_flight=(*state.in_flight, InFlight(entry.sequence, wire)),
        )
        save_sync_state(self.state_path, self._state)
        self._require_traffic().release(entry.sequence)
        self._pushed_at = time.monotonic()
        self._returns, self._losses, self._eval_since_push = [], [], None
        view = self._require_link().view
        self._record(
            "sync",
            sequence=entry.sequence,
            base_version=state.base_version,
            episodes=episodes,
            version=view.version,
            active_participants=view.active_participants,
            session_episodes=view.goal.episodes_done if view.goal else None,
            session_goal=view.goal.total_episodes if view.goal else None,
        )
        return entry.sequence

    def _nothing_to_push(self, weights: NamedArrays) -> SyncState:
        """A fresh state as of now, before any adoption: reference and model are `weights`."""
        counters = self._engine.counters
        return SyncState(
            base_version=-1,
            sequence=0,
            pushed_episodes=counters.episodes,
            pushed_env_steps=counters.env_steps,
            saved_episodes=counters.episodes,
            saved_env_steps=counters.env_steps,
            reference=weights,
            local=weights,
        )

    def _record(self, kind: str, **fields: Any) -> None:
        if self._on_record is not None:
            self._on_record(event_record(kind, self._engine.counters, **fields))

    def _metrics(self) -> pb.UpdateMetrics:
        metrics = pb.UpdateMetrics()
        if self._returns:
            metrics.mean_return = float(np.mean(self._returns))
        if self._eval_since_push is not None:
            metrics.eval_return = self._eval_since_push
        if self._unreported_score is not None:
            # The server credits it to that version's row: its best version is a scored one.
            metrics.base_eval_return = self._unreported_score.mean_return
            metrics.evaluated_version = self._unreported_score.version
            self._unreported_score = None
        if self._losses and math.isfinite(loss := float(np.mean(self._losses))):
            metrics.loss = loss
        return metrics

    def _adopt(self, model: GlobalModel) -> None:
        """Apply to the learner what others added to the global model, and nothing else.

        The reference is what the server holds of this model: the adopted
        version plus the deltas pushed since that it does not include yet.
        The new version includes this participant's updates up to
        `applied_sequence`; the deltas pushed after that are still on their way
        into a later version and stay in flight. So the new reference is
        g + (those deltas), and change = new reference − old reference is the
        others' contribution (under averaging, also the dilution of one's own
        delta). Both networks move by it ("shift", the default): the online
        net keeps everything it learned since the last push, and the target
        net keeps its lag behind the online net, so the TD targets a DQN
        bootstraps from do not jump at each adoption. A version holding only
        this participant's own pushes gives change = 0 up to float rounding
        (its deltas travel as the server decodes them, and the reference adds
        them the same way), so a participant alone in a session learns as it
        would offline: online and target net, optimizer and replay untouched.
        Shifting against resetting the target: docs/benchmarks.md, target at
        adoption.
        """
        assert self._state is not None
        state = self._state
        if model.version <= state.base_version:
            return
        reference, still_in_flight, change = rebase(
            state.reference, state.in_flight, model.tensors, model.applied_sequence
        )
        adopted = _plus(self._engine.weights(), change)
        counters = self._engine.counters
        self._state = replace(
            state,
            base_version=model.version,
            saved_episodes=counters.episodes,
            saved_env_steps=counters.env_steps,
            reference=reference,
            local=adopted,
            in_flight=still_in_flight,
        )
        save_sync_state(self.state_path, self._state)
        self._engine.adopt(adopted, target=self._target_at_adoption)
        # Two-player games: the version joins the league of opponents.
        self._engine.add_global_version(model.version, model.tensors)
        if self._scoring is not None:
            self._scoring.offer(model.version, model.tensors, env_steps=counters.env_steps)
        log.info("adopted global version %d", model.version)
        self._record(
            "adopt",
            version=model.version,
            change_norm=float(np.sqrt(sum(float(np.sum(c * c)) for _, c in change))),
        )

    # Progress and stop.

    @property
    def base_version(self) -> int:
        return self._state.base_version if self._state is not None else -1

    @property
    def unpushed_episodes(self) -> int:
        """Episodes trained since the last push (the session does not count them yet)."""
        pushed = self._state.pushed_episodes if self._state is not None else 0
        return self._engine.counters.episodes - pushed

    @property
    def unpushed_env_steps(self) -> int:
        """Env steps taken since the last push."""
        pushed = self._state.pushed_env_steps if self._state is not None else 0
        return self._engine.counters.env_steps - pushed

    @property
    def global_score(self) -> VersionScore | None:
        """The last global version scored here, and its greedy return, if any."""
        return self._last_score

    def close(self) -> None:
        """Stop the scoring thread (an evaluation under way is finished first)."""
        if self._scoring is not None:
            self._scoring.close()
            self._scoring = None

    def finish(self, *, deadline: float) -> int:
        """Push what is left and wait (until `deadline`, monotonic) for the acknowledgements.

        Returns how many updates stay unsent in the outbox.
        """
        link, traffic = self._require_link(), self._require_traffic()
        assert self._outbox is not None
        while link.fatal is None:
            assert self._state is not None
            if self._state.base_version < 0 and link.view.connected:
                # Joined, but no global model adopted yet: without a base the
                # progress cannot be pushed, so fetch one first.
                with contextlib.suppress(UnavailableError, RejectedError, TimeoutError):
                    traffic.refresh_now(max(1.0, deadline - time.monotonic()))
            if self._scoring is not None:
                # A score under way leaves with the last push: the session's best stays known.
                self._scoring.wait_idle(max(0.0, min(30.0, deadline - time.monotonic())))
            self._absorb()
            self.push()
            if not traffic.flush(max(0.0, deadline - time.monotonic())):
                log.warning("the server did not acknowledge every update in time")
                break
            if traffic.given_back == self._taken_back_count:
                break
            # The last push was refused as too stale: fetch the newest version,
            # rebase onto it and push the same progress again.
            with contextlib.suppress(UnavailableError, RejectedError, TimeoutError):
                traffic.refresh_now(max(1.0, deadline - time.monotonic()))
        left = len(self._outbox.pending(UPDATE))
        if left:
            log.warning("%d updates stay in the outbox and will be sent by the next run", left)
        return left

    def _require_link(self) -> ServerLink:
        if self._link is None:
            raise RuntimeError("weight sync not attached: call attach() first")
        return self._link

    def _require_traffic(self) -> WeightTraffic:
        if self._traffic is None:
            raise RuntimeError("weight sync not attached: call attach() first")
        return self._traffic


def rebase(
    reference: NamedArrays,
    in_flight: tuple[InFlight, ...],
    version: NamedArrays,
    applied_sequence: int,
) -> tuple[NamedArrays, tuple[InFlight, ...], NamedArrays]:
    """The new reference, the deltas still in flight, and the change adopting `version` brings.

    `version` includes this participant's updates up to `applied_sequence`;
    those pushed later are still on their way into a version and stay in
    flight. The new reference is the version plus them, and the change is
    new reference − old reference: what the others added (WeightSync._adopt).
    """
    still_in_flight = tuple(p for p in in_flight if p.sequence > applied_sequence)
    new_reference = [(n, np.asarray(g, dtype=np.float32)) for n, g in version]
    for pushed in still_in_flight:
        new_reference = _plus(new_reference, pushed.delta)
    return new_reference, still_in_flight, _minus(new_reference, reference)


def _plus(a: NamedArrays, b: NamedArrays) -> NamedArrays:
    return [(n, x + y) for (n, x), (_, y) in zip(a, b, strict=True)]


def _minus(a: NamedArrays, b: NamedArrays) -> NamedArrays:
    return [(n, x - y) for (n, x), (_, y) in zip(a, b, strict=True)]
