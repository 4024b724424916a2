"""Errors the storage layer raises for user mistakes and damaged stores.

Every message names the path involved and, where there is one, the fix. Nothing in this
package deletes or rewrites data in response to a damaged store: it raises and leaves
the bytes in place for a human to inspect.
"""

from __future__ import annotations


class StoreError(ValueError):
    """A store, table, segment or state that is missing, damaged or used wrongly."""


class IntegrityError(StoreError):
    """Stored bytes that do not match their recorded hash or shape (a corrupt file)."""
