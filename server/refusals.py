"""Why the server refuses a request: the domain's exceptions, one kind per status code.

The domain (federation/, experience/, population/, the strategy) raises
these and knows nothing of gRPC; transport/call_context.py maps each kind to
its status code for the servicers.
"""

from __future__ import annotations


class RequestRefusedError(Exception):
    """A request the server refuses; the subclass decides the status code."""


class InvalidRequestError(RequestRefusedError):
    """Malformed input (INVALID_ARGUMENT)."""


class IncompleteUploadError(InvalidRequestError):
    """An upload stream that ended before its final chunk: cut, cancelled or malformed.

    Answered INVALID_ARGUMENT like any malformed upload, but never counted
    against its participant as a refused update: a cancel looks the same.
    """


class PreconditionError(RequestRefusedError):
    """Well-formed but not acceptable in the current state (FAILED_PRECONDITION)."""


class NotFoundError(RequestRefusedError):
    """An unknown session or version (NOT_FOUND)."""


class AlreadyExistsError(RequestRefusedError):
    """A second seed of a session (ALREADY_EXISTS)."""


class LimitExceededError(RequestRefusedError):
    """A request above one of the server's size limits (RESOURCE_EXHAUSTED); names the option."""


class PermissionDeniedError(RequestRefusedError):
    """The request names a participant other than the caller (PERMISSION_DENIED)."""
