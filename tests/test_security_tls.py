"""The real server over real mutual TLS on 127.0.0.1: identity, transport policy, limits.

The server is tests.support.secure_federation's SecureFederation, as in the
other security suites.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.common.tls import create_ca, issue_participant_cert
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.security.auth import issue_token, revoke
from tests.support.secure_federation import (
    CALL_TIMEOUT_S,
    ONES,
    SPEC,
    ZERO,
    SecureFederation,
    rpc_error,
    seeded,
)
from tests.support.server_harness import (
    CHANNEL_OPTIONS,
    join,
    make_spec,
    metadata,
    pull,
    push,
    update_messages,
)


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[SecureFederation]:
    with SecureFederation(
        tmp_path, buffer_size=1, push_rate_per_s=0.01, push_burst=3, max_streams_per_participant=2
    ) as started:
        seeded(started, "owner", SPEC, ZERO)
        yield started


# Identity.


def test_participant_with_its_certificate_joins_pushes_and_pulls(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("Макар")
    join(stub, "Макар", SPEC)

    reply = push(stub, "Макар", SPEC, ONES, sequence=1, base_version=0)
    federation.wait_for_version("Макар", 1)

    assert reply.sequence == 1 and not reply.duplicate
    header, tensors, _ = pull(stub, participant_id="Макар")
    assert header.version == 1
    assert np.allclose(tensors[0], 1.0) and np.allclose(tensors[1], 1.0)


def test_push_naming_another_participant_is_permission_denied(
    federation: SecureFederation,
) -> None:
    mallory = federation.stub("mallory")
    join(mallory, "mallory", SPEC)
    messages = update_messages("owner", SPEC, ONES, sequence=1, base_version=0)

    error = rpc_error(lambda: mallory.PushUpdate(iter(messages), metadata=metadata("mallory")))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "mallory" in (error.details() or "")
    assert federation.pending() == 0


def test_join_naming_another_participant_is_permission_denied(
    federation: SecureFederation,
) -> None:
    mallory = federation.stub("mallory")
    request = pb.JoinRequest(session="default", participant_id="owner", spec=SPEC)

    error = rpc_error(lambda: mallory.Join(request, metadata=metadata("mallory")))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


def test_metadata_claiming_another_participant_is_permission_denied(
    federation: SecureFederation,
) -> None:
    mallory = federation.stub("mallory")

    error = rpc_error(lambda: join(mallory, "owner", SPEC))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "mallory" in (error.details() or "")


def test_call_without_participant_metadata_is_unauthenticated(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("owner")
    request = pb.GetVersionRequest(session="default", participant_id="owner")

    error = rpc_error(lambda: stub.GetVersion(request, timeout=CALL_TIMEOUT_S))

    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_revoked_participant_is_refused_on_its_next_call(federation: SecureFederation) -> None:
    stub = federation.stub("leaver")
    join(stub, "leaver", SPEC)

    revoke(federation.paths, "leaver")
    error = rpc_error(lambda: join(stub, "leaver", SPEC))

    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


# Transport policy.


def test_plaintext_client_cannot_reach_tls_server(federation: SecureFederation) -> None:
    with grpc.insecure_channel(federation.address) as plain:
        stub = pb_grpc.FederationStub(plain)  # type: ignore[no-untyped-call]

        error = rpc_error(lambda: join(stub, "owner", SPEC))

    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_fails_the_handshake(federation: SecureFederation) -> None:
    stranger = issue_participant_cert(create_ca("someone else's CA"), "owner")
    stub = pb_grpc.FederationStub(  # type: ignore[no-untyped-call]
        federation.stranger_channel(stranger)
    )

    error = rpc_error(lambda: join(stub, "owner", SPEC))

    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_token_participant_over_one_way_tls_acts_as_itself(tmp_path: Path) -> None:
    with SecureFederation(tmp_path, token_auth=True, buffer_size=1) as federation:
        token = issue_token(federation.paths, "Zoë")
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=federation.ca.cert_pem),
            grpc.access_token_call_credentials(token),
        )
        with grpc.secure_channel(federation.address, credentials, options=CHANNEL_OPTIONS) as ch:
            stub = pb_grpc.FederationStub(ch)  # type: ignore[no-untyped-call]

            joined = join(stub, "Zoë", SPEC)
            impostor = rpc_error(lambda: join(stub, "owner", SPEC))

    assert joined.current_version == -1
    assert impostor.code() == grpc.StatusCode.PERMISSION_DENIED


# Limits.


def test_push_rate_limit_is_resource_exhausted_and_names_the_limit(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("eager")
    join(stub, "eager", SPEC)
    for sequence in (1, 2, 3):
        push(stub, "eager", SPEC, ONES, sequence=sequence, base_version=0)

    error = rpc_error(lambda: push(stub, "eager", SPEC, ONES, sequence=4, base_version=0))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in (error.details() or "")


def test_streams_past_the_per_participant_limit_are_resource_exhausted(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("watcher")
    request = pb.GetVersionRequest(session="default", participant_id="watcher")
    open_streams = [
        stub.WatchVersions(request, metadata=metadata("watcher"), timeout=CALL_TIMEOUT_S)
        for _ in range(2)
    ]
    for stream in open_streams:
        next(stream)

    error = rpc_error(
        lambda: next(stub.WatchVersions(request, metadata=metadata("watcher"), timeout=30))
    )

    for stream in open_streams:
        stream.cancel()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "stream limit" in (error.details() or "")


def test_spec_above_the_model_size_limit_is_resource_exhausted(tmp_path: Path) -> None:
    with SecureFederation(tmp_path, max_model_bytes=1 << 20) as federation:
        huge = make_spec([(1024, 1024)])

        error = rpc_error(lambda: join(federation.stub("big"), "big", huge))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max-model-bytes" in (error.details() or "")


def test_spec_with_integer_tensors_is_refused_before_it_fixes_a_session(
    federation: SecureFederation,
) -> None:
    spec = make_spec([(4,)])
    spec.tensors[0].dtype = tpb.DTYPE_INT64

    error = rpc_error(lambda: join(federation.stub("counter"), "counter", spec, session="ints"))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "float32" in (error.details() or "")
