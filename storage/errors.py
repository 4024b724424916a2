"""Errors the storage layer raises for user mistakes, damaged stores and failing storage.

Every message names the path (or endpoint) involved and, where there is one, the fix.
Nothing in this package deletes or rewrites data in response to a damaged store: it raises
and leaves the bytes in place for a human to inspect.
"""

from __future__ import annotations


class StoreError(ValueError):
    """A store, table, segment or state that is missing, damaged or used wrongly."""


class IntegrityError(StoreError):
    """Stored bytes that do not match their recorded hash or shape (a corrupt file)."""


class StoreFullError(StoreError):
    """The device (or quota) holding the store is full (ENOSPC/EDQUOT). Nothing of the
    failed write became visible; the same write succeeds once space is freed."""

    def __init__(self, message: str, path: str, errno: int) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class StoreUnavailableError(StoreError):
    """An object store that did not answer within the retry budget (storage.retry). The
    operation's outcome is unknown for a write: nothing is cleaned up, a retry settles it."""

    def __init__(self, message: str, endpoint: str, attempts: int) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.attempts = attempts
