"""The Population gRPC servicer: messages <-> domain calls, refusals -> status codes.

Nothing here decides anything a unit test of population/population.py could
not reach: each handler reads its messages, decodes tensors as every upload
is decoded (transport/uploads.py), calls Population, and answers refusals
with their status codes (transport/call_context.py).
"""

# The generated servicer base class fixes the method names (Enroll, Report, PullDonor, ...).
# ruff: noqa: N802

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import ExitStack

from fedrl.common.chunking import DecodeLimits, chunk_tensors
from fedrl.proto.v1 import federation_pb2 as fpb
from fedrl.proto.v1 import population_pb2 as pb
from fedrl.proto.v1 import population_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.federation.session import goal_state
from fedrl.server.population.population import Population, ReportRequest
from fedrl.server.population.records import Assignment
from fedrl.server.refusals import InvalidRequestError
from fedrl.server.transport.call_context import REFUSALS, Context, abort, acting_as, limits_key
from fedrl.server.transport.grpc_server import ServiceRegistration
from fedrl.server.transport.limits import CallLimits, LimitsConfig
from fedrl.server.transport.uploads import assemble_uploads, first_message, upload_bytes

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Population"].full_name


class PopulationServicer(pb_grpc.PopulationServicer):
    """Population of protocol v1 over a Population domain object."""

    def __init__(
        self,
        population: Population,
        *,
        limits: DecodeLimits,
        chunk_bytes: int,
        call_limits: LimitsConfig,
    ) -> None:
        self._population = population
        self._limits = limits
        self._chunk_bytes = chunk_bytes
        # A report uploads two lists, its model and its learner, each within the limits.
        self._calls = CallLimits(
            call_limits, max_upload_bytes=2 * upload_bytes(limits), what="report"
        )

    def registration(self) -> ServiceRegistration:
        """This servicer as a service of the server."""
        return ServiceRegistration.of(SERVICE_NAME, pb_grpc.add_PopulationServicer_to_server, self)

    async def Enroll(self, request: pb.EnrollRequest, context: Context) -> pb.MemberAssignment:
        try:
            pid = acting_as(context, request.participant_id)
            assignment = await self._population.enroll(
                request.session, pid, dict(request.hyperparameters)
            )
        except REFUSALS as exc:
            await abort(context, exc)
        return self._assignment(assignment)

    async def Report(
        self, request_iterator: AsyncIterator[pb.ReportChunk], context: Context
    ) -> pb.ReportReply:
        try:
            return await self._calls.upload(
                limits_key(context),
                request_iterator,
                "report",
                lambda messages: self._report(messages, context),
            )
        except REFUSALS as exc:
            await abort(context, exc)

    async def _report(
        self, messages: AsyncIterator[pb.ReportChunk], context: Context
    ) -> pb.ReportReply:
        first = await first_message(messages, "ReportHeader")
        if not first.HasField("header"):
            raise InvalidRequestError("a report stream must start with its ReportHeader")
        header = first.header
        request = ReportRequest(
            session=header.session,
            participant_id=acting_as(context, header.participant_id),
            spec_hash=header.spec_hash,
            sequence=header.sequence,
            generation=header.generation,
            env_steps=header.env_steps,
            episodes=header.episodes,
            score=header.score if header.HasField("score") else None,
        )
        headers = {"chunk": header.tensors}
        if header.HasField("learner"):
            headers["learner_chunk"] = header.learner
        lists = await assemble_uploads(headers, messages, "report", self._limits)
        outcome = await self._population.report(request, lists["chunk"], lists.get("learner_chunk"))
        verdict = outcome.verdict
        return pb.ReportReply(
            sequence=request.sequence,
            duplicate=outcome.duplicate,
            assignment=self._assignment(outcome.assignment),
            decision="" if verdict is None else verdict.decision,
            reason=_reason(outcome.stale, verdict.reason if verdict else ""),
            goal=goal_state(outcome.goal_total, outcome.goal_done),
        )

    async def PullDonor(
        self, request: pb.PullDonorRequest, context: Context
    ) -> AsyncIterator[fpb.ModelChunk]:
        with ExitStack() as open_stream:
            try:
                open_stream.enter_context(self._calls.streams.hold(limits_key(context)))
                pid = acting_as(context, request.participant_id)
                donor = await self._population.donor(request.session, pid, request.generation)
                header, chunks = await asyncio.to_thread(
                    chunk_tensors,
                    donor.tensors,
                    dtype=tpb.DTYPE_FLOAT32,
                    chunk_bytes=self._chunk_bytes,
                )
            except REFUSALS as exc:
                await abort(context, exc)
                return
            yield fpb.ModelChunk(
                header=fpb.ModelHeader(
                    session=donor.session,
                    version=donor.generation,
                    spec_hash=donor.spec_hash,
                    tensors=header,
                )
            )
            for chunk in chunks:
                yield fpb.ModelChunk(chunk=chunk)

    async def PullDonorLearner(
        self, request: pb.PullDonorRequest, context: Context
    ) -> AsyncIterator[pb.LearnerChunk]:
        with ExitStack() as open_stream:
            try:
                open_stream.enter_context(self._calls.streams.hold(limits_key(context)))
                pid = acting_as(context, request.participant_id)
                donor = await self._population.donor_learner(
                    request.session, pid, request.generation
                )
                header, chunks = tpb.TensorListHeader(), list[tpb.TensorChunk]()
                if donor.tensors is not None:
                    # As reported: float32 state, int64 counters, the replay's own dtypes.
                    header, chunks = await asyncio.to_thread(
                        chunk_tensors, donor.tensors, chunk_bytes=self._chunk_bytes
                    )
            except REFUSALS as exc:
                await abort(context, exc)
                return
            yield pb.LearnerChunk(
                header=pb.LearnerHeader(
                    session=donor.session,
                    generation=donor.generation,
                    present=donor.tensors is not None,
                    tensors=header,
                )
            )
            for chunk in chunks:
                yield pb.LearnerChunk(chunk=chunk)

    def _assignment(self, assignment: Assignment) -> pb.MemberAssignment:
        return pb.MemberAssignment(
            generation=assignment.generation,
            hyperparameters=assignment.hyperparameters,
            adopt=assignment.adopt,
            donor=assignment.donor,
            donor_generation=assignment.donor_generation,
            last_report_sequence=assignment.last_sequence,
            replay_transitions=self._population.replay_transitions,
            keeps_learner=True,
        )


def _reason(stale: bool, reason: str) -> str:
    if stale:
        return "trained in a generation this member has left: adopt its assignment first"
    return reason
