"""The sync loop: a participant's training engine federated with a fedrl server.

Training never waits for the network. The engine's poll loop runs in the
main thread and calls `SyncLoop.after_poll` after every round; all gRPC
traffic runs on an asyncio loop in one background thread (`_Network`). The
two meet in three places only: the durable outbox (main thread writes,
network thread sends and deletes), a "sendable through" sequence number, and
a slot holding the newest pulled global model, which the main thread adopts
at its next round. So actors and learner keep going through slow pulls,
outages and server restarts.

Every `sync_interval` local episodes, once the previous update has been
acknowledged (one in flight at a time, so a slow link or the server's rate
limit makes updates larger, not late), the main thread:

1. takes an INCREMENTAL delta, local − reference, where the reference is the
   weights at the last push or adoption (the lead's decision: a delta from
   the last adopted global would resend the previous push's progress when no
   new global arrived in between, counting it twice), writes it to the outbox
   with the counts since the last push and the metrics, then records the new
   reference in the sync state file, and only then lets the network thread
   send it;
2. adopts a newer global version g if the network thread pulled one:
   local := g + (local − reference), the reference := g. The term in brackets
   is what was learned since the last push and not yet sent, so adoption
   loses no local work. The learner's target network is reset to the new
   weights by default (`target_at_adoption` also offers keep and shift). The
   optimizer state (Adam's moments) is kept: it describes the loss surface
   around a nearby model, and resetting it would restart Adam's bias
   correction with oversized first steps after every sync.
3. stops when the session goal is reached (the server says so, or its count
   plus this participant's unpushed episodes reach it): the current round
   finishes, the remaining progress is pushed, the outbox flushed (bounded
   wait), and the caller saves.

Experience exchange (optional, `exchange=`; the engine then trains from a
MixedReplay). Every `sync_interval` episodes the main thread also queues a
sample of recent local transitions in the same outbox (kind "experience");
a task of the network thread beside the updates' (so a slow transfer never
holds an update back) sends them and pulls other participants' transitions,
which the main thread adds to the replay as foreign at its next round
(fedrl.client.federation.experience_sync has the details).

Exploration needs no global schedule: actors use fixed Ape-X rates
(fedrl.client.training.exploration), not a decay from ε = 1, so a participant who
joins a session late explores like everyone else from its first step.

Refused updates. An update the server refuses as too stale (FAILED_PRECONDITION
after a rejoin, e.g. a backlog after a long outage) is handed back by the
outbox; the main thread subtracts its delta from the reference and its
counts from the pushed counters, so its progress and its episodes leave
again with the next update, based on a newer version. Any other refusal (a
malformed update: a bug) is logged and kept in the outbox's rejected/ folder.

Crash safety. The sync state file (`sync/<session>/state.npz`, numpy arrays
without pickle) holds the reference, the local weights and counters when it
was written, the base version and the last sequence inside the reference. It
is written after each outbox entry and each adoption, and read back at start:

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

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import gymnasium as gym
import numpy as np
import numpy.typing as npt

from fedrl.client.federation.backoff import Backoff, BackoffPolicy
from fedrl.client.federation.experience_sync import KIND as EXPERIENCE
from fedrl.client.federation.experience_sync import (
    CursorFile,
    ExchangeConfig,
    ExperienceClient,
    ExperienceSync,
    MixedReplay,
)
from fedrl.client.federation.federation_client import (
    AlreadySeededError,
    FederationClient,
    GlobalModel,
    RejectedError,
    SpecMismatchError,
    UnavailableError,
    build_update,
)
from fedrl.client.federation.outbox import (
    Entry,
    Outbox,
    OutboxLimits,
    decode_update,
    update_messages,
)
from fedrl.client.training.engine import PollResult, TrainingEngine
from fedrl.client.training.learner import TARGET_AT_ADOPTION, TargetAtAdoption
from fedrl.client.training.vector_env import make_vector_env
from fedrl.common.durable_files import write_atomically
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

log = logging.getLogger(__name__)

T = TypeVar("T")
NamedArrays = list[tuple[str, npt.NDArray[Any]]]
STATE_FORMAT = 1
STATE_FILE = "state.npz"
EXPERIENCE_CURSOR_FILE = "experience_cursor.json"
DELTA_DTYPES = {
    "bfloat16": tpb.DTYPE_BFLOAT16,
    "float16": tpb.DTYPE_FLOAT16,
    "float32": tpb.DTYPE_FLOAT32,
}


_DEFAULT_OUTBOX_LIMITS = OutboxLimits()
_DEFAULT_BACKOFF = BackoffPolicy()


class SyncError(RuntimeError):
    """The federation cannot go on (e.g. the session refuses this model); the message says why."""


# The model's description for the session.


def model_spec(
    env_id: str,
    weights: Sequence[tuple[str, np.ndarray]],
    algorithm: str,
    *,
    data: str | None = None,
) -> tpb.ModelSpec:
    """The ModelSpec of a Q-network over a Gymnasium env: its tensors, spaces and family.

    `data` is the env's data file (--data), when it takes one: spaces may depend on it.
    """
    env = make_vector_env(env_id, 1, data)
    try:
        observation, action = env.single_observation_space, env.single_action_space
    finally:
        env.close()
    # make_vector_env has checked these already; the asserts narrow the types.
    assert isinstance(observation, gym.spaces.Box)
    assert isinstance(action, gym.spaces.Discrete)
    return tpb.ModelSpec(
        tensors=[
            tpb.TensorSpec(name=name, dtype=tpb.DTYPE_FLOAT32, shape=list(array.shape))
            for name, array in weights
        ],
        env_id=env_id,
        observation_space=tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_BOX,
            shape=list(observation.shape),
            # The engine feeds observations to the network as float32 whatever the env's dtype.
            dtype=tpb.DTYPE_FLOAT32,
            low=[float(v) for v in np.ravel(observation.low)],
            high=[float(v) for v in np.ravel(observation.high)],
        ),
        action_space=tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_DISCRETE, shape=[], dtype=tpb.DTYPE_INT64, n=int(action.n)
        ),
        algorithm=algorithm,
    )


# The sync state file.


@dataclass(frozen=True)
class SyncState:
    """What the next delta is measured from, and the local model it belongs to."""

    base_version: int
    """Global version the reference descends from; -1 before the first adoption."""
    sequence: int
    """Last update sequence whose delta the reference includes (0: none)."""
    pushed_episodes: int
    """The participant's episode counter at the last push."""
    pushed_env_steps: int
    """The participant's env-step counter at the last push."""
    saved_episodes: int
    """The episode counter when this state was written."""
    saved_env_steps: int
    """The env-step counter when this state was written."""
    reference: NamedArrays
    """Weights at the last push or adoption."""
    local: NamedArrays
    """Local weights when this state was written."""
    taken_back: tuple[int, ...] = ()
    """Sequences of updates the server refused as too stale whose progress is back in
    local − reference (so a crash before their file is deleted cannot add them twice)."""


def save_sync_state(path: Path, state: SyncState) -> None:
    """Write atomically (temp file, fsync, rename, directory fsync)."""
    meta = {
        "format": STATE_FORMAT,
        "base_version": state.base_version,
        "sequence": state.sequence,
        "pushed_episodes": state.pushed_episodes,
        "pushed_env_steps": state.pushed_env_steps,
        "saved_episodes": state.saved_episodes,
        "saved_env_steps": state.saved_env_steps,
        "taken_back": list(state.taken_back),
        "names": [name for name, _ in state.reference],
    }
    arrays: dict[str, Any] = {
        "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    }
    for index, ((_, reference), (_, local)) in enumerate(
        zip(state.reference, state.local, strict=True)
    ):
        arrays[f"reference_{index}"] = np.asarray(reference, dtype=np.float32)
        arrays[f"local_{index}"] = np.asarray(local, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda file: np.savez(file, **arrays))


def load_sync_state(path: Path) -> SyncState | None:
    """The saved state, or None if there is none; SyncError if it cannot be trusted."""
    if not path.exists():
        return None
    try:
        # allow_pickle=False: a state dir copied from elsewhere must not run code.
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            if meta.get("format") != STATE_FORMAT:
                raise SyncError(f"{path} has format {meta.get('format')}, expected {STATE_FORMAT}")
            names = [str(n) for n in meta["names"]]
            reference = [(n, np.array(data[f"reference_{i}"])) for i, n in enumerate(names)]
            local = [(n, np.array(data[f"local_{i}"])) for i, n in enumerate(names)]
            return SyncState(
                base_version=int(meta["base_version"]),
                sequence=int(meta["sequence"]),
                pushed_episodes=int(meta["pushed_episodes"]),
                pushed_env_steps=int(meta["pushed_env_steps"]),
                saved_episodes=int(meta["saved_episodes"]),
                saved_env_steps=int(meta["saved_env_steps"]),
                reference=reference,
                local=local,
                taken_back=tuple(int(s) for s in meta["taken_back"]),
            )
    except SyncError:
        raise
    except Exception as exc:
        raise SyncError(
            f"{path} cannot be read ({exc}); move it away to resynchronise from the server"
        ) from exc


# The network thread.


@dataclass(frozen=True)
class ServerView:
    """The latest facts heard from the server, for progress display and the stop decision."""

    connected: bool = False
    version: int = -1
    goal: pb.GoalState | None = None
    active_participants: int = 0
    acknowledged: int = 0
    """Updates acknowledged during this run."""
    duplicates: int = 0
    """Acknowledgements that were answers to a resend (recognised by the server)."""


class _Network:
    """All gRPC traffic of one participant, on an asyncio loop in a background thread."""

    def __init__(
        self,
        *,
        channel_factory: Callable[[], grpc.aio.Channel],
        participant_id: str,
        session: str,
        spec: tpb.ModelSpec,
        backoff: BackoffPolicy,
        poll_interval_s: float,
        experience: ExperienceSync | None,
    ) -> None:
        self._channel_factory = channel_factory
        self._experience = experience
        self._experience_client: ExperienceClient | None = None
        self._participant_id = participant_id
        self._session = session
        self._spec = spec
        self._outbox: Outbox | None = None
        self._backoff = Backoff(backoff)
        self._experience_backoff = Backoff(backoff)
        self._poll_interval_s = poll_interval_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fedrl-sync", daemon=True
        )
        self._lock = threading.Lock()
        self._client: FederationClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._experience_task: asyncio.Task[None] | None = None
        self._experience_wake: asyncio.Event | None = None
        self._joined = False
        self._rejoined_for: int | None = None
        self._held: GlobalModel | None = None
        # Shared with the main thread, under _lock.
        self._sendable_through = 0
        self._pending: GlobalModel | None = None
        self._seed_weights: NamedArrays | None = None
        self._view = ServerView()
        self._fatal: Exception | None = None
        self._given_back = 0

    # Main-thread side.

    def start(self) -> None:
        self._thread.start()
        self.call(self._open())

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the network loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def prepare(self, outbox: Outbox, seed_weights: NamedArrays) -> None:
        """What joining needs beyond the spec: the outbox, and weights to seed an empty session."""
        self._outbox = outbox
        with self._lock:
            self._seed_weights = seed_weights

    def probe(self, timeout_s: float) -> pb.JoinReply:
        """Join without touching local state; SyncError if the session refuses this model."""
        return self.call(asyncio.wait_for(self._probe(), timeout_s), timeout_s + 5)

    def connect(self) -> pb.JoinReply:
        """Join now, seeding an empty session; raises what Join raises."""
        return self.call(self._join())

    def run_in_background(self) -> None:
        """Start the loop that sends, refreshes and retries until close()."""
        self._task = asyncio.run_coroutine_threadsafe(self._spawn_main(), self._loop).result()

    def release(self, sequence: int) -> None:
        """Updates up to `sequence` are recorded in the sync state: they may go out."""
        with self._lock:
            self._sendable_through = max(self._sendable_through, sequence)
        self._poke()

    @property
    def chunk_bytes(self) -> int:
        """Chunk size the server asks for (its default before the first join)."""
        return self._require_client().chunk_bytes

    def poke(self) -> None:
        """New work is in the outbox: send it now rather than at the next poll."""
        self._poke()

    @property
    def given_back(self) -> int:
        """How many updates were handed back so far (the main thread takes them back)."""
        with self._lock:
            return self._given_back

    def refresh_now(self, timeout_s: float) -> None:
        """Check for a newer global version and pull it now (for take_pending)."""
        self.call(asyncio.wait_for(self._refresh(), timeout_s), timeout_s + 5)

    def take_pending(self) -> GlobalModel | None:
        with self._lock:
            model, self._pending = self._pending, None
            return model

    @property
    def view(self) -> ServerView:
        with self._lock:
            return self._view

    @property
    def fatal(self) -> Exception | None:
        with self._lock:
            return self._fatal

    def flush(self, timeout_s: float) -> bool:
        """Wait until every released update is acknowledged; False if time ran out."""
        try:
            self.call(asyncio.wait_for(self._drain(), timeout_s), timeout_s + 5)
        except TimeoutError:
            return False
        return True

    def raise_goal(self, total_episodes: int) -> pb.GoalState:
        client = self._require_client()
        return self.call(client.raise_goal(total_episodes))

    def status(self) -> pb.StatusReply:
        return self.call(self._require_client().status())

    def leave(self, reason: str) -> None:
        with contextlib.suppress(UnavailableError, RejectedError):
            self.call(self._require_client().leave(reason), timeout=20)

    def close(self) -> None:
        if self._thread.is_alive():
            self.call(self._close(), timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    def _poke(self) -> None:
        for wake in (self._wake, self._experience_wake):
            if wake is not None:
                self._loop.call_soon_threadsafe(wake.set)

    def _require_client(self) -> FederationClient:
        if self._client is None:
            raise RuntimeError("network not started")
        return self._client

    def _require_outbox(self) -> Outbox:
        if self._outbox is None:
            raise RuntimeError("network not prepared: call prepare() first")
        return self._outbox

    # Network-thread side.

    async def _open(self) -> None:
        self._channel = self._channel_factory()
        self._client = FederationClient(
            self._channel, participant_id=self._participant_id, session=self._session
        )
        if self._experience is not None:
            self._experience_client = ExperienceClient(
                self._channel, participant_id=self._participant_id, session=self._session
            )
        self._wake = asyncio.Event()
        self._experience_wake = asyncio.Event()

    async def _spawn_main(self) -> asyncio.Task[None]:
        if self._experience is not None:
            self._experience_task = asyncio.create_task(self._experience_main())
        return asyncio.create_task(self._main())

    async def _close(self) -> None:
        for task in (self._task, self._experience_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._channel is not None:
            await self._channel.close()

    async def _main(self) -> None:
        assert self._wake is not None
        while True:
            delay = self._poll_interval_s
            # Cleared before the work, so a release during it is not missed.
            self._wake.clear()
            try:
                if not self._joined:
                    await self._join()
                await self._send_released()
                await self._refresh()
                if self._backoff.failures:
                    log.warning("server reachable again; outbox flushed")
                self._backoff.succeeded()
                self._set_view(connected=True)
            except UnavailableError as exc:
                delay = self._backoff.failed()
                self._set_view(connected=False)
                log.warning(
                    "server unreachable (%s); training goes on, retry %d in %.1f s",
                    exc,
                    self._backoff.failures,
                    delay,
                )
            except (RejectedError, SyncError) as exc:
                with self._lock:
                    self._fatal = exc
                log.error("federation stopped: %s", exc)
                return
            except Exception as exc:
                # A bug here must stop the run loudly, not leave it training
                # without a sync while the outbox silently fills.
                with self._lock:
                    self._fatal = exc
                log.exception("federation stopped by an unexpected error")
                return
            if self._backoff.failures:
                # A new update does not cut a backoff short: that would turn an
                # outage into a retry storm at the pace of training.
                await asyncio.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _experience_main(self) -> None:
        """Experience exchange on a task of its own, beside _main.

        In series with the updates, a slow or hanging experience transfer (a
        frozen server: the transfer timeout is long) would hold the model
        updates back that long.
        """
        assert self._experience_wake is not None
        backoff = self._experience_backoff
        while True:
            delay = self._poll_interval_s
            self._experience_wake.clear()
            if self._joined:
                try:
                    await self._exchange_experience()
                    backoff.succeeded()
                except UnavailableError as exc:
                    delay = backoff.failed()
                    log.warning(
                        "experience exchange failed (%s); retry %d in %.1f s",
                        exc,
                        backoff.failures,
                        delay,
                    )
                except Exception as exc:
                    # As in _main: a refusal or a bug stops the run loudly.
                    with self._lock:
                        self._fatal = exc
                    log.exception("federation stopped by the experience exchange")
                    return
            if backoff.failures:
                await asyncio.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._experience_wake.wait(), delay)

    async def _exchange_experience(self) -> None:
        if self._experience is None or self._experience_client is None:
            return
        try:
            await self._experience.exchange(self._experience_client, self._require_outbox())
        except RejectedError as exc:
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # Not a member any more (e.g. a server restored from a backup):
            # join again next round rather than stop training over experience.
            log.warning("experience exchange refused (%s); joining again", exc)
            self._joined = False

    async def _probe(self) -> pb.JoinReply:
        try:
            return await self._require_client().join(self._spec)
        except SpecMismatchError as exc:
            raise SyncError(str(exc)) from None

    async def _join(self) -> pb.JoinReply:
        client = self._require_client()
        outbox = self._require_outbox()
        reply = await self._probe()
        outbox.observe_acknowledged("update", reply.last_update_sequence)
        outbox.observe_acknowledged(EXPERIENCE, reply.last_experience_sequence)
        version = reply.current_version
        if version < 0:
            with self._lock:
                weights = self._seed_weights
            if weights is None:
                raise SyncError("the session has no model and this participant none to seed it")
            try:
                version = await client.seed_model(weights)
                log.info("seeded session %r with this participant's model", self._session)
            except AlreadySeededError:
                version = (await client.get_version()).current_version
        self._joined = True
        self._set_view(connected=True, version=version, goal=reply.goal)
        return reply

    async def _send_released(self) -> None:
        client = self._require_client()
        outbox = self._require_outbox()
        while True:
            pending = outbox.pending("update")
            with self._lock:
                through = self._sendable_through
            if not pending or pending[0].merged_through > through:
                return
            entry = outbox.next_to_send("update", through=through)
            assert entry is not None
            try:
                reply = await client.push_update(update_messages(entry))
            except RejectedError as exc:
                if (
                    exc.code == grpc.StatusCode.FAILED_PRECONDITION
                    and self._rejoined_for != entry.sequence
                ):
                    # The server may have forgotten us (a restored backup):
                    # join again and retry once before giving the update up.
                    self._rejoined_for = entry.sequence
                    self._joined = False
                    await self._join()
                    continue
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                    # Refused as it stands (too stale): its progress goes into
                    # the next update, which is based on a newer version.
                    outbox.give_back("update", entry.sequence, str(exc))
                    with self._lock:
                        self._given_back += 1
                else:
                    outbox.reject("update", entry.sequence, str(exc))
                continue
            outbox.acknowledge("update", entry.sequence)
            if reply.duplicate:
                log.info(
                    "update %d had been acknowledged before the restart; the server kept "
                    "its first answer",
                    entry.sequence,
                )
            view = self.view
            self._set_view(
                version=max(view.version, reply.current_version),
                goal=reply.goal,
                acknowledged=view.acknowledged + 1,
                duplicates=view.duplicates + int(reply.duplicate),
            )

    async def _refresh(self) -> None:
        client = self._require_client()
        notice = await client.get_version()
        self._set_view(
            version=notice.current_version,
            goal=notice.goal,
            active_participants=notice.active_participants,
        )
        held = self._held.version if self._held is not None else -1
        if notice.current_version > held:
            model = await client.pull_model(have=self._held)
            self._held = model
            with self._lock:
                self._pending = model

    async def _drain(self) -> None:
        outbox = self._require_outbox()
        while True:
            with self._lock:
                through = self._sendable_through
            experience = self._experience is not None and self._experience.enabled
            if not any(e.sequence <= through for e in outbox.pending("update")) and not (
                experience and outbox.pending(EXPERIENCE)
            ):
                return
            if self.fatal is not None:
                return
            self._poke()
            await asyncio.sleep(0.1)

    def _set_view(self, **changes: Any) -> None:
        with self._lock:
            self._view = replace(self._view, **changes)


# The main-thread side of the sync loop.


class SyncLoop:
    """Pushes the engine's progress, adopts global models, and tells when the goal is reached."""

    def __init__(
        self,
        engine: TrainingEngine,
        *,
        state_dir: Path,
        participant_id: str,
        session: str,
        spec: tpb.ModelSpec,
        channel_factory: Callable[[], grpc.aio.Channel],
        sync_interval: int = 10,
        delta_dtype: str = "bfloat16",
        evaluate_global: bool = True,
        outbox_limits: OutboxLimits = _DEFAULT_OUTBOX_LIMITS,
        backoff: BackoffPolicy = _DEFAULT_BACKOFF,
        poll_interval_s: float = 2.0,
        exchange: ExchangeConfig | None = None,
        target_at_adoption: TargetAtAdoption = "reset",
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`exchange` with a share above 0 trades experience with the session; the engine
        must then have been built with `replay=mixed_replay(...)` (see experience_exchange).
        `target_at_adoption` is what the learner's target network does when a global model
        is adopted (Learner.set_weights).
        `on_record` receives one metrics record per push ("sync") and adoption ("adopt")."""
        if target_at_adoption not in TARGET_AT_ADOPTION:
            raise ValueError(
                f"target_at_adoption must be one of {', '.join(TARGET_AT_ADOPTION)}, "
                f"got {target_at_adoption!r}"
            )
        self._target_at_adoption: TargetAtAdoption = target_at_adoption
        if sync_interval < 1:
            raise ValueError(f"sync interval must be at least one episode, got {sync_interval}")
        self._on_record = on_record
        if delta_dtype not in DELTA_DTYPES:
            raise ValueError(
                f"delta dtype must be one of {', '.join(DELTA_DTYPES)}, got {delta_dtype!r}"
            )
        self._engine = engine
        self._dir = state_dir
        self._experience: ExperienceSync | None = None
        self._replay: MixedReplay | None = None
        if exchange is not None and exchange.enabled:
            replay = engine.learner.replay
            if not isinstance(replay, MixedReplay):
                raise ValueError(
                    "experience exchange needs the engine's learner to use a MixedReplay: "
                    "build the engine with replay=mixed_replay(...), or set foreign_share to 0"
                )
            self._replay = replay
            self._experience = ExperienceSync(
                exchange,
                obs_shape=engine.obs_shape,
                n_step=engine.config.n_step,
                gamma=engine.learner.config.gamma,
                spec_hash=spec_hash(spec),
                session=session,
                participant_id=participant_id,
                cursor=CursorFile(state_dir / EXPERIENCE_CURSOR_FILE),
            )
            engine.on_batch(self._experience.record)
        self._participant_id = participant_id
        self._session = session
        self._spec = spec
        self._spec_hash = spec_hash(spec)
        self._channel_factory = channel_factory
        self._sync_interval = sync_interval
        self._delta_dtype = DELTA_DTYPES[delta_dtype]
        self._evaluate_global = evaluate_global
        self._outbox_limits = outbox_limits
        self._backoff = backoff
        self._poll_interval_s = poll_interval_s
        self._state: SyncState | None = None
        self._outbox: Outbox | None = None
        self._network: _Network | None = None
        self._returns: list[float] = []
        self._losses: list[float] = []
        self._eval_since_push: float | None = None
        self._base_eval: tuple[int, float] | None = None
        self._next_global_eval = 0
        self._taken_back_count = 0
        self._experience_queued_at = 0

    @property
    def state_path(self) -> Path:
        return self._dir / STATE_FILE

    # Start.

    def start(self, *, connect_timeout_s: float = 20.0) -> pb.JoinReply | None:
        """Join the session and restore the sync state; None when the server is unreachable.

        SyncError when the session refuses this model, before anything local
        is written, so a wrong model or session leaves the state dir as it was.
        """
        self._network = _Network(
            channel_factory=self._channel_factory,
            participant_id=self._participant_id,
            session=self._session,
            spec=self._spec,
            backoff=self._backoff,
            poll_interval_s=self._poll_interval_s,
            experience=self._experience,
        )
        network = self._network
        try:
            network.start()
            reply: pb.JoinReply | None = None
            try:
                reply = network.probe(connect_timeout_s)
            except (UnavailableError, TimeoutError) as exc:
                log.warning("server unreachable at start (%s); training offline until then", exc)
            state = self._restore()
            self._experience_queued_at = self._engine.counters.episodes
            network.prepare(self._open_outbox(), state.local)
            if reply is not None:
                try:
                    reply = network.connect()
                except UnavailableError as exc:
                    log.warning("server lost while joining (%s); retrying in the background", exc)
                    reply = None
            network.release(state.sequence)
            network.run_in_background()
        except BaseException:
            self.close()
            raise
        return reply

    def _open_outbox(self) -> Outbox:
        if self._outbox is None:
            self._outbox = Outbox(self._dir / "outbox", limits=self._outbox_limits)
        return self._outbox

    def _restore(self) -> SyncState:
        """Reconcile the sync state, the outbox and the autosaved model (module docstring)."""
        outbox = self._open_outbox()
        counters = self._engine.counters
        state = load_sync_state(self.state_path)
        if state is None:
            weights = self._engine.weights()
            state = SyncState(
                base_version=-1,
                sequence=0,
                pushed_episodes=counters.episodes,
                pushed_env_steps=counters.env_steps,
                saved_episodes=counters.episodes,
                saved_env_steps=counters.env_steps,
                reference=weights,
                local=weights,
            )
        for entry in outbox.pending("update"):
            if entry.sequence > state.sequence:
                header, delta = decode_update(entry)
                log.info(
                    "folding update %d into the reference (written before a crash)", entry.sequence
                )
                reference = [
                    (n, r + d) for (n, r), (_, d) in zip(state.reference, delta, strict=True)
                ]
                state = replace(
                    state,
                    sequence=entry.merged_through,
                    reference=reference,
                    local=reference,
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
        for entry in outbox.returned("update"):
            if entry.sequence not in state.taken_back:
                state = self._take_back(state, entry)
        self._state = state
        save_sync_state(self.state_path, state)
        for entry in outbox.returned("update"):
            outbox.forget_returned("update", entry.sequence)
        return state

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
            reference=[(n, r - d) for (n, r), (_, d) in zip(state.reference, delta, strict=True)],
            pushed_episodes=state.pushed_episodes - header.episodes,
            pushed_env_steps=state.pushed_env_steps - header.env_steps,
            taken_back=(*state.taken_back, entry.sequence),
        )

    def _take_back_returned(self) -> None:
        assert self._state is not None
        outbox = self._open_outbox()
        returned = outbox.returned("update")
        state = self._state
        for entry in returned:
            if entry.sequence not in state.taken_back:
                state = self._take_back(state, entry)
        self._state = state
        save_sync_state(self.state_path, state)
        for entry in returned:
            outbox.forget_returned("update", entry.sequence)

    # Every round.

    def after_poll(self, result: PollResult) -> None:
        """Record the round; push when the interval is full; adopt a pulled global model."""
        assert self._state is not None and self._network is not None
        self._returns.extend(result.episode_returns)
        if "loss" in result.train_metrics:
            self._losses.append(result.train_metrics["loss"])
        if result.evaluation is not None:
            self._eval_since_push = result.evaluation.mean
        fatal = self._network.fatal
        if fatal is not None:
            raise SyncError(f"federation stopped: {fatal}")
        self._absorb()
        episodes = self._engine.counters.episodes
        if episodes - self._state.pushed_episodes >= self._sync_interval and not (
            self._open_outbox().pending("update")
        ):
            # One update in flight at a time: while the previous one waits
            # (a slow link, the server's rate limit, an outage) the progress
            # keeps growing in local − reference and leaves as one fresher
            # update, instead of a queue of deltas on ever older bases that
            # the global model would take in late.
            self.push()
        # Its own clock: before the first adoption push() writes nothing and
        # leaves pushed_episodes behind, but experience still goes out.
        if episodes - self._experience_queued_at >= self._sync_interval:
            self.queue_experience()

    def _absorb(self) -> None:
        """Take back updates the server handed back; adopt a newly pulled global model."""
        assert self._network is not None
        given_back = self._network.given_back
        if given_back != self._taken_back_count:
            self._taken_back_count = given_back
            self._take_back_returned()
        model = self._network.take_pending()
        if model is not None:
            self._adopt(model)
        if self._experience is not None and self._replay is not None:
            self._experience.adopt(self._replay)

    def push(self) -> int | None:
        """Write the progress since the last push to the outbox; its sequence, or None if none."""
        assert self._state is not None and self._network is not None
        state = self._state
        counters = self._engine.counters
        env_steps = counters.env_steps - state.pushed_env_steps
        if state.base_version < 0 or env_steps <= 0:
            # Never synced: the progress stays in local − reference and goes
            # out with the first push after the first adoption.
            return None
        local = self._engine.weights()
        delta = [(n, w - r) for (n, w), (_, r) in zip(local, state.reference, strict=True)]
        metrics = self._metrics()
        episodes = counters.episodes - state.pushed_episodes
        outbox = self._open_outbox()
        entry = outbox.add(
            "update",
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
        self._state = replace(
            state,
            sequence=entry.sequence,
            pushed_episodes=counters.episodes,
            pushed_env_steps=counters.env_steps,
            saved_episodes=counters.episodes,
            saved_env_steps=counters.env_steps,
            reference=local,
            local=local,
        )
        save_sync_state(self.state_path, self._state)
        self._network.release(entry.sequence)
        self._returns, self._losses, self._eval_since_push = [], [], None
        view = self.view
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

    def _record(self, kind: str, **fields: Any) -> None:
        if self._on_record is None:
            return
        counters = self._engine.counters
        record: dict[str, Any] = {
            "kind": kind,
            "time": round(time.time(), 3),
            "episode": counters.episodes,
            "env_steps": counters.env_steps,
        }
        record.update({key: value for key, value in fields.items() if value is not None})
        self._on_record(record)

    def queue_experience(self) -> int | None:
        """Queue a sample of recent transitions for the session; its sequence, or None if none.

        Independent of push(): experience needs no base version, so it flows
        before the first adoption too.
        """
        if self._experience is None or self._network is None:
            return None
        self._experience_queued_at = self._engine.counters.episodes
        entry = self._experience.queue(self._open_outbox(), chunk_bytes=self._network.chunk_bytes)
        if entry is None:
            return None
        self._network.poke()
        return entry.sequence

    def _metrics(self) -> pb.UpdateMetrics:
        metrics = pb.UpdateMetrics()
        if self._returns:
            metrics.mean_return = float(np.mean(self._returns))
        if self._eval_since_push is not None:
            metrics.eval_return = self._eval_since_push
        if self._base_eval is not None and self._state is not None:
            version, value = self._base_eval
            if version == self._state.base_version:
                metrics.base_eval_return = value
        if self._losses and math.isfinite(loss := float(np.mean(self._losses))):
            metrics.loss = loss
        return metrics

    def _adopt(self, model: GlobalModel) -> None:
        assert self._state is not None
        state = self._state
        if model.version <= state.base_version:
            return
        local = self._engine.weights()
        rebased = [
            (n, (g + (w - r)).astype(np.float32))
            for (n, g), (_, w), (_, r) in zip(model.tensors, local, state.reference, strict=True)
        ]
        counters = self._engine.counters
        self._state = replace(
            state,
            base_version=model.version,
            saved_episodes=counters.episodes,
            saved_env_steps=counters.env_steps,
            reference=model.tensors,
            local=rebased,
        )
        save_sync_state(self.state_path, self._state)
        interval = self._engine.config.eval_interval
        if self._evaluate_global and interval and counters.env_steps >= self._next_global_eval:
            # The server tracks the best global version by this number. Like
            # the local evaluation, at most once per eval_interval env steps:
            # a good CartPole model costs 5000 greedy steps per evaluation.
            self._base_eval = (model.version, self._engine.evaluate(model.tensors).mean)
            self._next_global_eval = counters.env_steps + interval
        self._engine.set_weights(rebased, target=self._target_at_adoption)
        log.info("adopted global version %d", model.version)
        global_eval = (
            self._base_eval[1] if self._base_eval and self._base_eval[0] == model.version else None
        )
        self._record("adopt", version=model.version, global_eval=global_eval)

    # Progress and stop.

    @property
    def view(self) -> ServerView:
        assert self._network is not None
        return self._network.view

    @property
    def base_version(self) -> int:
        return self._state.base_version if self._state is not None else -1

    @property
    def goal_reached(self) -> bool:
        """The server says so, or its count plus this participant's unpushed episodes reach it.

        The second half saves a sync interval of overshoot: the final push in
        finish() then takes the session over the goal.
        """
        goal = self.view.goal
        if goal is None or self._state is None:
            return False
        unpushed = self._engine.counters.episodes - self._state.pushed_episodes
        return goal.reached or goal.episodes_done + unpushed >= goal.total_episodes > 0

    @property
    def global_eval(self) -> float | None:
        """Greedy return of the last global model evaluated here, if any."""
        return self._base_eval[1] if self._base_eval is not None else None

    def raise_goal(self, total_episodes: int) -> pb.GoalState:
        assert self._network is not None
        return self._network.raise_goal(total_episodes)

    def status(self) -> pb.StatusReply:
        assert self._network is not None
        return self._network.status()

    def finish(self, *, flush_timeout_s: float = 60.0, leave: bool = True) -> int:
        """Push what is left, wait for the acknowledgements, leave; returns updates still unsent."""
        network = self._network
        assert network is not None
        deadline = time.monotonic() + flush_timeout_s
        self.queue_experience()
        while network.fatal is None:
            assert self._state is not None
            if self._state.base_version < 0 and network.view.connected:
                # Joined, but no global model adopted yet: without a base the
                # progress cannot be pushed, so fetch one first.
                with contextlib.suppress(UnavailableError, RejectedError, TimeoutError):
                    network.refresh_now(max(1.0, deadline - time.monotonic()))
            self._absorb()
            self.push()
            if not network.flush(max(0.0, deadline - time.monotonic())):
                log.warning("server did not acknowledge everything in %.0f s", flush_timeout_s)
                break
            if network.given_back == self._taken_back_count:
                break
            # The last push was refused as too stale: fetch the newest version,
            # rebase onto it and push the same progress again.
            with contextlib.suppress(UnavailableError, RejectedError, TimeoutError):
                network.refresh_now(max(1.0, deadline - time.monotonic()))
        left = len(self._open_outbox().pending("update"))
        if left:
            log.warning("%d updates stay in the outbox and will be sent by the next run", left)
        if leave and self.view.connected:
            network.leave("finished")
        return left

    def close(self) -> None:
        if self._network is not None:
            self._network.close()
            self._network = None
