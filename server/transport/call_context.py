"""What a servicer reads from a call and answers through it: who calls, refusals as status codes.

Every servicer (federation, experience, population) takes the participant a
request speaks for from here, and answers a refusal with the status code it
maps to here, so the services cannot drift apart on either.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeAlias

import grpc

from fedrl.common.errors import DecodeError
from fedrl.common.identity import id_from_metadata, validate_participant_id
from fedrl.server.refusals import (
    AlreadyExistsError,
    InvalidRequestError,
    LimitExceededError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    RequestRefusedError,
)

# grpc ships no type stubs; a servicer context is untyped to mypy either way.
Context: TypeAlias = Any


class CallError(Exception):
    """A call refused with a status code of its own: authentication, a per-participant limit."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


# Most specific first: DecodeError is a ValueError, so order matters.
STATUS_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (DecodeError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (LimitExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
)
REFUSALS = (RequestRefusedError, DecodeError, CallError)
"""Refusals a handler answers with their own status; any other exception is a bug (INTERNAL)."""


def status_code(exc: BaseException) -> grpc.StatusCode | None:
    """The status code a refusal maps to; None for a bug (INTERNAL)."""
    if isinstance(exc, CallError):
        return exc.code
    for kind, code in STATUS_CODES:
        if isinstance(exc, kind):
            return code
    return None


async def abort(context: Context, exc: Exception) -> NoReturn:
    """End the call with the refusal's status and message; a bug is raised as it is."""
    code = status_code(exc)
    if code is None:
        raise exc
    await context.abort(code, str(exc))
    raise RuntimeError("context.abort returned instead of raising") from exc


def authenticated_participant(context: Context) -> str | None:
    """Who the transport says is calling; None when it does not say.

    This is the `fedrl-participant-bin` metadata. Over TLS the AuthInterceptor
    has checked before the handler runs that it names the participant of the
    certificate or token, so it is authenticated; on a plaintext server
    (loopback or --insecure) it is what the caller says.
    """
    try:
        return id_from_metadata(context.invocation_metadata())
    except ValueError as exc:
        raise InvalidRequestError(f"caller identity: {exc}") from None


ANONYMOUS = ""
"""Limits key of a plaintext caller that does not say who it is; such callers share it."""


def limits_key(context: Context) -> str:
    """Whose per-participant limits a call counts against: the authenticated caller's."""
    return authenticated_participant(context) or ANONYMOUS


def acting_as(context: Context, claimed: str) -> str:
    """The participant a request speaks for, refused if it is not the caller."""
    try:
        pid = validate_participant_id(claimed)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    caller = authenticated_participant(context)
    if caller is not None and caller != pid:
        raise PermissionDeniedError(f"you are {caller!r} and may not act as {pid!r}")
    return pid
