"""Damaged population reports (model and learner chunks) against a real server, with hypothesis.

A valid report carries its header, its model's chunks, then its learner's.
Whatever is done to that stream (a message dropped, repeated or moved, a
chunk's bytes flipped, a learner chunk sent as a model chunk, the learner's
declared sizes changed), the server answers OK or a status that says what
was wrong (never UNKNOWN or INTERNAL, an unhandled exception), and a refused
report leaves the member where it stood: the server's last taken sequence
is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.proto.v1 import population_pb2 as pb
from fedrl.proto.v1 import population_pb2_grpc as pb_grpc
from tests.support.population import (
    enroll,
    join_population,
    population_stub,
    report_messages,
)
from tests.support.server_harness import InProcessServer, make_spec, metadata, server_config

SPEC = make_spec([(8, 8)])
MEMBER = "fuzzer"
ACCEPTABLE = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
CHANGES = ("drop", "repeat", "move", "flip", "as_model", "learner_sizes")


@pytest.fixture(scope="module")
def population(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pb_grpc.PopulationStub]:
    data: Path = tmp_path_factory.mktemp("server")
    with InProcessServer(server_config(data, chunk_bytes=256)) as server:
        join_population(server.stub(), MEMBER, SPEC)
        stub = population_stub(server.address)
        enroll(stub, MEMBER)
        yield stub


def learner(fill: int) -> list[tuple[str, np.ndarray]]:
    return [
        ("target/w", np.full((8, 8), fill, np.float32)),
        ("position/updates", np.asarray(fill, np.int64)),
        ("replay/action", np.arange(100, dtype=np.int64) % 3),
    ]


def damage(messages: list[pb.ReportChunk], change: str, at: int, to: int) -> list[pb.ReportChunk]:
    body = [pb.ReportChunk.FromString(m.SerializeToString()) for m in messages]
    at, to = 1 + at % (len(body) - 1), 1 + to % (len(body) - 1)
    if change == "drop":
        del body[at]
    elif change == "repeat":
        body.insert(at, body[at])
    elif change == "move":
        body.insert(to, body.pop(at))
    elif change == "flip":
        part = body[at].WhichOneof("part")
        chunk = getattr(body[at], part)
        if chunk.data:
            chunk.data = bytes([chunk.data[0] ^ 0xFF]) + chunk.data[1:]
    elif change == "as_model":
        learners = [i for i, m in enumerate(body) if m.HasField("learner_chunk")]
        first = learners[at % len(learners)]
        body[first] = pb.ReportChunk(chunk=body[first].learner_chunk)
    else:
        body[0].header.learner.total_raw_size += 1 + to
    return body


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(change=st.sampled_from(CHANGES), at=st.integers(0, 1000), to=st.integers(0, 1000))
def test_a_damaged_report_is_taken_whole_or_refused_leaving_the_member_as_it_was(
    population: pb_grpc.PopulationStub, change: str, at: int, to: int
) -> None:
    # prepare: the next report, one part of it damaged
    before = enroll(population, MEMBER).last_report_sequence
    sequence = before + 1
    messages = report_messages(
        MEMBER,
        SPEC,
        [np.random.default_rng(sequence).normal(size=(8, 8)).astype(np.float32)],
        sequence=sequence,
        env_steps=sequence,
        score=1.0,
        learner=learner(sequence),
    )

    # act
    try:
        population.Report(iter(damage(messages, change, at, to)), metadata=metadata(MEMBER))
        code = grpc.StatusCode.OK
    except grpc.RpcError as error:
        code = error.code()

    # assert
    assert code in ACCEPTABLE, code
    after = enroll(population, MEMBER).last_report_sequence
    assert after == (sequence if code == grpc.StatusCode.OK else before)
