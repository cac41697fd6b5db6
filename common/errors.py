"""The one error type for outside input that does not decode."""

from __future__ import annotations


class DecodeError(ValueError):
    """Bytes or messages from outside that fail a check; maps to INVALID_ARGUMENT.

    The message says what was wrong in words a participant can act on.
    """
