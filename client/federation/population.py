"""A participant as one member of a population session (population-based training).

The member trains alone, as an offline participant would, and after every
evaluation reports its latest model, its learner beside it and its score to
the server (proto/fedrl/v1/population.proto). Training never waits for the
network: the calls run on an asyncio loop in a background thread, one report
in flight at a time (a newer evaluation replaces a report still waiting to
leave), and the main thread looks at the outcome at its next round.

A report's learner (fedrl.client.training.learner_copy) is what another
member needs to become this one: the DQN target network, Adam's state, the
schedules' clocks and the newest transitions of the replay (as many as the
server asks for), or PPO's Adam state and clocks. Model, learner and score
are taken in one moment of the main thread, so they describe one learner.

When the server ranks the member into the bottom of the population, the
reply is an exploit: the network thread pulls the donor's model and learner,
and the main thread becomes that learner (TrainingEngine.copy_learner) and
trains on with the explored hyperparameters (fedrl.common.hyperparameters),
restarting DQN actors whose ε, n-step or γ changed; it keeps its own env
stream, counters and evaluation seeds. A member reports its learner only to
a server that keeps it (MemberAssignment.keeps_learner), and a donor that
reported none (a client or server without it) gives its model alone: the
target network is reset to it and Adam's moments cleared. A report still
waiting that was taken before the adoption is dropped: the server would not
keep a model of a generation the member has left.

Crash safety needs no local file: the server is the record. At start the
member Enrolls and gets its generation, hyperparameters and, if it had not
adopted its last exploit before it stopped, the exploit again; its report
sequence continues from the server's count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.errors import UnavailableError
from fedrl.client.federation.event_record import event_record
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.loop_thread import LoopThread
from fedrl.client.training.counters import PollResult
from fedrl.client.training.engine import TrainingEngine
from fedrl.common.chunking import NamedTensors, TensorListAssembler, chunk_tensors
from fedrl.common.errors import DecodeError
from fedrl.proto.v1 import federation_pb2 as fpb
from fedrl.proto.v1 import population_pb2 as pb
from fedrl.proto.v1 import population_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb

log = logging.getLogger(__name__)

T = TypeVar("T")

POPULATION_MODE = "pbt"
MAX_REPLAY_BYTES = 256 << 20
"""The most bytes of replay transitions one report carries: well inside a server's default
decode limit (1 GiB, --max-model-bytes) and a member's memory, whatever the observations (an
Atari transition's two frame stacks are 56 KB: some 4,700 of them)."""


class PopulationError(RuntimeError):
    """The population refused this member in a way retrying cannot mend."""


class PopulationClient(FederationClient):
    """The Federation calls plus the Population service's, as one member."""

    def __init__(self, channel: grpc.aio.Channel, **options: Any) -> None:
        super().__init__(channel, **options)
        self._population = pb_grpc.PopulationStub(channel)  # type: ignore[no-untyped-call]

    async def enroll(self, hyperparameters: Mapping[str, float]) -> pb.MemberAssignment:
        request = pb.EnrollRequest(
            session=self.session,
            participant_id=self.participant_id,
            hyperparameters=dict(hyperparameters),
        )
        reply: pb.MemberAssignment = await self._unary(self._population.Enroll, request, "enroll")
        return reply

    async def report(
        self,
        *,
        sequence: int,
        generation: int,
        env_steps: int,
        episodes: int,
        score: float | None,
        weights: Sequence[tuple[str, np.ndarray]],
        learner: Sequence[tuple[str, np.ndarray]] | None = None,
    ) -> pb.ReportReply:
        """The member's full model (float32, so a copy of it is exact), its learner (its own
        dtypes) and figures."""
        tensors, chunks = chunk_tensors(
            weights, dtype=tpb.DTYPE_FLOAT32, chunk_bytes=self.chunk_bytes
        )
        header = pb.ReportHeader(
            session=self.session,
            participant_id=self.participant_id,
            spec_hash=self.spec_hash,
            sequence=sequence,
            generation=generation,
            env_steps=env_steps,
            episodes=episodes,
            tensors=tensors,
        )
        if score is not None:
            header.score = score
        learner_chunks: list[tpb.TensorChunk] = []
        if learner is not None:
            learner_header, learner_chunks = chunk_tensors(learner, chunk_bytes=self.chunk_bytes)
            header.learner.CopyFrom(learner_header)
        messages = [
            pb.ReportChunk(header=header),
            *(pb.ReportChunk(chunk=c) for c in chunks),
            *(pb.ReportChunk(learner_chunk=c) for c in learner_chunks),
        ]
        reply: pb.ReportReply = await self._stream_unary(
            self._population.Report, messages, f"report {sequence}"
        )
        return reply

    async def pull_donor(self, generation: int) -> NamedTensors:
        """The weights generation `generation` of this member starts from."""
        request = pb.PullDonorRequest(
            session=self.session, participant_id=self.participant_id, generation=generation
        )
        call = self._population.PullDonor(
            request, metadata=self._metadata, timeout=self._timeouts.transfer_s
        )
        _, tensors = await self._receive_model(
            call, f"pull of generation {generation}'s donor model"
        )
        return tensors

    async def pull_donor_learner(self, generation: int) -> NamedTensors | None:
        """The learner reported with that donor model; None where the donor reported none."""
        request = pb.PullDonorRequest(
            session=self.session, participant_id=self.participant_id, generation=generation
        )
        call = self._population.PullDonorLearner(
            request, metadata=self._metadata, timeout=self._timeouts.transfer_s
        )
        return await self._receive(
            call, f"pull of generation {generation}'s donor learner", self._assemble_learner
        )

    async def _assemble_learner(self, call: AsyncIterator[pb.LearnerChunk]) -> NamedTensors | None:
        header: pb.LearnerHeader | None = None
        assembler: TensorListAssembler | None = None
        async for message in call:
            if header is None:
                if not message.HasField("header"):
                    raise DecodeError("learner stream does not start with its LearnerHeader")
                header = message.header
                if header.present:
                    assembler = TensorListAssembler(header.tensors, self._limits)
            elif assembler is None or not message.HasField("chunk"):
                raise DecodeError("a second header, or chunks of no learner, in the stream")
            else:
                assembler.add(message.chunk)
        if header is None:
            raise DecodeError("empty learner stream")
        return None if assembler is None else assembler.result()


@dataclass(frozen=True)
class _Report:
    """A snapshot to report: taken in the main thread, sent by the network thread."""

    sequence: int
    generation: int
    env_steps: int
    episodes: int
    score: float | None
    weights: NamedTensors
    learner: NamedTensors | None


@dataclass(frozen=True)
class _Donor:
    """What an exploit copies: the donor's model, and its learner if it reported one."""

    model: NamedTensors
    learner: NamedTensors | None


@dataclass(frozen=True)
class _Outcome:
    reply: pb.ReportReply
    donor: _Donor | None


class PopulationMember:
    """The engine as one member of a population: report, get ranked, exploit and explore."""

    def __init__(
        self,
        engine: TrainingEngine,
        *,
        participant_id: str,
        session: str,
        spec: tpb.ModelSpec,
        channel_factory: Callable[[], grpc.aio.Channel],
        on_record: Callable[[dict[str, Any]], None] | None = None,
        backoff: BackoffPolicy | None = None,
    ) -> None:
        self._engine = engine
        self._participant_id = participant_id
        self._session = session
        self._spec = spec
        self._channel_factory = channel_factory
        self._on_record = on_record
        self._backoff = backoff or BackoffPolicy()
        self._loop = LoopThread("fedrl-population")
        self._client: PopulationClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._next_sequence = 1
        self._waiting: _Report | None = None
        self._in_flight: Future[_Outcome] | None = None
        self._goal: fpb.GoalState | None = None
        self._replay_transitions = 0
        self._keeps_learner = False
        self.generation = 0
        """Exploits so far: the generation this member trains in."""
        self.reports = 0
        """Reports the server took during this run."""

    # Start and stop.

    def start(self) -> pb.MemberAssignment:
        """Join (creating the population if need be), enroll, and take the server's assignment."""
        self._loop.start()
        joined, assignment = self._call(self._enter(), timeout_s=120.0)
        self._goal = joined.goal
        self._next_sequence = assignment.last_report_sequence + 1
        donor = None
        if assignment.adopt:
            donor = self._call(self._pull_donor(assignment.generation))
        self._apply(assignment, donor, why="the server's record of this member")
        return assignment

    async def _enter(self) -> tuple[fpb.JoinReply, pb.MemberAssignment]:
        self._channel = self._channel_factory()
        self._client = PopulationClient(
            self._channel, participant_id=self._participant_id, session=self._session
        )
        joined = await self._retrying(lambda c: c.join(self._spec, mode=POPULATION_MODE))
        assignment = await self._retrying(lambda c: c.enroll(self._engine.hyperparameters()))
        return joined, assignment

    def finish(self, *, timeout_s: float = 60.0) -> None:
        """Report the final model (waiting up to `timeout_s`), then leave the session."""
        counters = self._engine.counters
        self._settle(timeout_s)
        self._waiting = self._snapshot(counters.last_eval)
        self._send_waiting()
        self._settle(timeout_s)
        try:
            self._call(self._client_call(lambda c: c.leave("finished")), timeout_s=15.0)
        except (UnavailableError, TimeoutError) as exc:
            log.warning("could not leave the session: %s", exc)

    def close(self) -> None:
        """Close the channel and end the network thread with nothing left pending on it."""
        self._loop.close(self._close_channel(), timeout=10.0)

    async def _close_channel(self) -> None:
        if self._channel is not None:
            # Closing a channel at exit must not turn a clean stop into an error.
            with contextlib.suppress(Exception):
                await self._channel.close()

    # Every round.

    def after_poll(self, result: PollResult) -> None:
        """Take a finished report's outcome; queue a report after every evaluation."""
        if self._in_flight is not None and self._in_flight.done():
            outcome = self._in_flight.result()
            self._in_flight = None
            self._take(outcome)
        if result.evaluation is not None:
            self._waiting = self._snapshot(result.evaluation.mean)
        self._send_waiting()

    @property
    def goal_reached(self) -> bool:
        return self._goal is not None and self._goal.reached

    @property
    def goal(self) -> fpb.GoalState | None:
        return self._goal

    def status(self) -> fpb.StatusReply:
        return self._call(self._client_call(lambda c: c.status(max_versions=1)))

    # Internals: reports.

    def _snapshot(self, score: float | None) -> _Report:
        counters = self._engine.counters
        report = _Report(
            sequence=self._next_sequence,
            generation=self.generation,
            env_steps=counters.env_steps,
            episodes=counters.episodes,
            score=score if score is not None and math.isfinite(score) else None,
            weights=self._engine.weights(),
            learner=self._engine.learner_state(
                replay_transitions=self._replay_transitions, max_replay_bytes=MAX_REPLAY_BYTES
            )
            if self._keeps_learner
            else None,
        )
        self._next_sequence += 1
        return report

    def _send_waiting(self) -> None:
        if self._waiting is None or self._in_flight is not None:
            return
        report, self._waiting = self._waiting, None
        self._in_flight = self._loop.submit(self._send(report))

    async def _send(self, report: _Report) -> _Outcome:
        reply = await self._retrying(
            lambda c: c.report(
                sequence=report.sequence,
                generation=report.generation,
                env_steps=report.env_steps,
                episodes=report.episodes,
                score=report.score,
                weights=report.weights,
                learner=report.learner,
            )
        )
        donor = None
        assignment = reply.assignment
        if assignment.adopt and assignment.generation > report.generation:
            donor = await self._pull_donor(assignment.generation)
        return _Outcome(reply, donor)

    async def _pull_donor(self, generation: int) -> _Donor:
        model = await self._retrying(lambda c: c.pull_donor(generation))
        learner = None
        if self._keeps_learner:
            learner = await self._retrying(lambda c: c.pull_donor_learner(generation))
        return _Donor(model, learner)

    def _take(self, outcome: _Outcome) -> None:
        reply = outcome.reply
        self._goal = reply.goal
        self.reports += not reply.duplicate
        self._record(
            "report",
            sequence=reply.sequence,
            generation=self.generation,
            decision=reply.decision or None,
            reason=reply.reason or None,
        )
        if reply.decision:
            log.info("ranked: %s (%s)", reply.decision, reply.reason)
        self._apply(reply.assignment, outcome.donor, why=reply.reason)

    def _apply(self, assignment: pb.MemberAssignment, donor: _Donor | None, *, why: str) -> None:
        """Take the server's assignment: a new generation's donor learner and hyperparameters."""
        self._replay_transitions = assignment.replay_transitions
        self._keeps_learner = assignment.keeps_learner
        values = dict(assignment.hyperparameters)
        if assignment.generation <= self.generation and values == dict(
            self._engine.hyperparameters()
        ):
            return
        if assignment.adopt and assignment.generation > self.generation:
            if donor is None:
                raise PopulationError(
                    f"generation {assignment.generation} came without its donor model"
                )
            copied = self._copy(donor)
            # A report taken before the adoption describes a model the member left.
            self._waiting = None
            log.info(
                "generation %d: copied %s (generation %d): %s; %s",
                assignment.generation,
                assignment.donor,
                assignment.donor_generation,
                copied,
                why,
            )
        self._engine.set_hyperparameters(values)
        if assignment.generation != self.generation:
            self._record(
                "exploit",
                generation=assignment.generation,
                donor=assignment.donor or None,
                donor_generation=assignment.donor_generation,
                hyperparameters=values,
            )
        self.generation = assignment.generation

    def _copy(self, donor: _Donor) -> str:
        """Become the donor: its whole learner where it reported one, else its model alone."""
        if donor.learner is not None:
            try:
                added = self._engine.copy_learner(donor.model, donor.learner)
            except ValueError as exc:
                log.warning("the donor's learner does not fit this one (%s): model only", exc)
            else:
                return f"its whole learner, {added} replay transitions"
        self._engine.set_weights(donor.model, target="reset")
        self._engine.learner.reset_optimizer()
        return "its model only"

    # Internals: calls on the network thread.

    def _call(self, coroutine: Coroutine[Any, Any, T], *, timeout_s: float = 600.0) -> T:
        return self._loop.call(coroutine, timeout_s)

    async def _client_call(self, call: Callable[[PopulationClient], Coroutine[Any, Any, T]]) -> T:
        assert self._client is not None
        return await call(self._client)

    async def _retrying(self, call: Callable[[PopulationClient], Coroutine[Any, Any, T]]) -> T:
        """`call` until the server answers; a refusal (RejectedError) is raised at once."""
        assert self._client is not None
        failures = 0
        while True:
            try:
                return await call(self._client)
            except UnavailableError as exc:
                failures += 1
                delay = self._backoff.delay(failures)
                log.warning("population call failed (%s); again in %.1f s", exc, delay)
                await asyncio.sleep(delay)

    def _settle(self, timeout_s: float) -> None:
        """Wait for the report in flight, and take its outcome."""
        if self._in_flight is None:
            return
        try:
            outcome = self._in_flight.result(timeout_s)
        except TimeoutError:
            log.warning("the last report got no answer in %.0f s", timeout_s)
            return
        finally:
            if self._in_flight.done():
                self._in_flight = None
        self._take(outcome)

    def _record(self, kind: str, **fields: Any) -> None:
        if self._on_record is not None:
            self._on_record(event_record(kind, self._engine.counters, **fields))
