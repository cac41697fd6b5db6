"""What can go wrong talking to the server, as the two kinds of error a caller decides on.

gRPC status codes become domain errors in the service clients
(federation_client, experience_client), because that is all a caller decides on:

- `UnavailableError`: try the same request again later, with backoff; the
  outbox keeps what was not acknowledged.
- `RejectedError`: sending it again cannot help; `code` and the server's
  message say why.

`SyncError` is the sync loop's own: the federation cannot go on at all.
"""

from __future__ import annotations

import grpc


class ServerCallError(Exception):
    """A call to the server failed; `code` is the gRPC status (None for a local check)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class UnavailableError(ServerCallError):
    """The server could not answer now; retry the same request later with backoff."""


class RejectedError(ServerCallError):
    """The server refused the request; repeating it unchanged cannot succeed."""


class SpecMismatchError(RejectedError):
    """The session refuses this participant at Join: its model spec, mode or rules differ
    from the session's; the message names the field or rule and both values."""


class AlreadySeededError(RejectedError):
    """Another participant seeded the session first; pull its model instead."""


class SyncError(RuntimeError):
    """The federation cannot go on (e.g. the session refuses this model); the message says why."""
