"""Population calls for tests, spoken with the real chunking code over a plain channel.

stub = population_stub(address)
join(federation_stub, "alice", SPEC, mode="pbt")
enroll(stub, "alice", DQN_VALUES)
reply = report(stub, "alice", SPEC, [weights], sequence=1, env_steps=20_000, score=12.0)
tensors = pull_donor(stub, "alice", generation=1)
learner = pull_donor_learner(stub, "alice", generation=1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from fedrl.common.chunking import DecodeLimits, TensorListAssembler, chunk_tensors
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as fpb
from fedrl.proto.v1 import federation_pb2_grpc as fpb_grpc
from fedrl.proto.v1 import population_pb2 as pb
from fedrl.proto.v1 import population_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.server_harness import channel, metadata, named

DQN_VALUES = {
    "lr": 1e-3,
    "replay_ratio": 0.5,
    "n_step": 3.0,
    "target_update_interval": 500.0,
    "gamma": 0.99,
    "exploration_base": 0.4,
}
"""A DQN member's hyperparameters: the defaults, each inside its search range."""


def population_stub(address: str) -> pb_grpc.PopulationStub:
    return pb_grpc.PopulationStub(channel(address))  # type: ignore[no-untyped-call]


def join_population(
    stub: fpb_grpc.FederationStub,
    participant_id: str,
    spec: tpb.ModelSpec,
    *,
    session: str = "default",
    mode: str = "pbt",
) -> fpb.JoinReply:
    return stub.Join(  # type: ignore[no-any-return]
        fpb.JoinRequest(
            session=session,
            participant_id=participant_id,
            spec=spec,
            spec_hash=spec_hash(spec),
            mode=mode,
        ),
        metadata=metadata(participant_id),
    )


def enroll(
    stub: pb_grpc.PopulationStub,
    participant_id: str,
    hyperparameters: Mapping[str, float] = DQN_VALUES,
    *,
    session: str = "default",
) -> pb.MemberAssignment:
    return stub.Enroll(  # type: ignore[no-any-return]
        pb.EnrollRequest(
            session=session, participant_id=participant_id, hyperparameters=dict(hyperparameters)
        ),
        metadata=metadata(participant_id),
    )


def report(
    stub: pb_grpc.PopulationStub,
    participant_id: str,
    spec: tpb.ModelSpec,
    arrays: Sequence[np.ndarray],
    **fields: Any,
) -> pb.ReportReply:
    """One report (report_messages' `fields`), sent and answered."""
    messages = report_messages(participant_id, spec, arrays, **fields)
    return stub.Report(iter(messages), metadata=metadata(participant_id), timeout=60)  # type: ignore[no-any-return]


def report_messages(
    participant_id: str,
    spec: tpb.ModelSpec,
    arrays: Sequence[np.ndarray],
    *,
    sequence: int,
    generation: int = 0,
    env_steps: int = 0,
    episodes: int = 0,
    score: float | None = None,
    learner: Sequence[tuple[str, np.ndarray]] | None = None,
    session: str = "default",
) -> list[pb.ReportChunk]:
    """A report's stream: its header, the model's chunks, then the learner's."""
    list_header, chunks = chunk_tensors(named(spec, arrays))
    header = pb.ReportHeader(
        session=session,
        participant_id=participant_id,
        spec_hash=spec_hash(spec),
        sequence=sequence,
        generation=generation,
        env_steps=env_steps,
        episodes=episodes,
        tensors=list_header,
    )
    if score is not None:
        header.score = score
    learner_chunks: list[tpb.TensorChunk] = []
    if learner is not None:
        learner_header, learner_chunks = chunk_tensors(learner)
        header.learner.CopyFrom(learner_header)
    return [
        pb.ReportChunk(header=header),
        *(pb.ReportChunk(chunk=c) for c in chunks),
        *(pb.ReportChunk(learner_chunk=c) for c in learner_chunks),
    ]


def pull_donor(
    stub: pb_grpc.PopulationStub,
    participant_id: str,
    generation: int,
    *,
    session: str = "default",
) -> list[np.ndarray]:
    stream = stub.PullDonor(
        pb.PullDonorRequest(session=session, participant_id=participant_id, generation=generation),
        metadata=metadata(participant_id),
    )
    assembler: TensorListAssembler | None = None
    for message in stream:
        if message.HasField("header"):
            assembler = TensorListAssembler(message.header.tensors, DecodeLimits())
        else:
            assert assembler is not None, "chunk before the model header"
            assembler.add(message.chunk)
    assert assembler is not None, "empty PullDonor stream"
    return [array for _, array in assembler.result()]


def pull_donor_learner(
    stub: pb_grpc.PopulationStub,
    participant_id: str,
    generation: int,
    *,
    session: str = "default",
) -> list[tuple[str, np.ndarray]] | None:
    """The donor's learner as the server streams it; None where it says there is none."""
    stream = stub.PullDonorLearner(
        pb.PullDonorRequest(session=session, participant_id=participant_id, generation=generation),
        metadata=metadata(participant_id),
    )
    header: pb.LearnerHeader | None = None
    assembler: TensorListAssembler | None = None
    for message in stream:
        if message.HasField("header"):
            header = message.header
            if header.present:
                assembler = TensorListAssembler(header.tensors, DecodeLimits())
        else:
            assert assembler is not None, "chunk without a learner header"
            assembler.add(message.chunk)
    assert header is not None, "empty PullDonorLearner stream"
    return None if assembler is None else assembler.result()


def refused(call: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return call.code(), call.details() or ""
