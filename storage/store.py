"""The MEG Store: one table of immutable, committed segments per agent.

Layout under ``{store_url}/{run_id}/`` (documented for users in docs/store.md)::

    store.json                                  run manifest (format, schema_version)
    {agent}/table.json                          table manifest
    {agent}/segments/{segment id}/{attempt}/    one Zarr v3 group per write attempt
    {agent}/commits/{segment id}.json           commit marker: names the visible attempt
    {agent}/consumed/{step}.json                what the trainer consumed at that step
    _blobs/{sha256}                             large text by reference

Idempotent retries: an attempt writes its own folder, then puts the marker exclusively.
The first attempt to commit wins; a later attempt of the same key finds the marker and
returns the committed segment (its own data, if written, is removed). Uncommitted
attempts (a writer killed mid-segment) are invisible and never block a retry.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from storage.backends import Backend, open_backend
from storage.errors import StoreError
from storage.manifest import (
    STORE_FORMAT,
    check_manifest,
    check_name,
    new_manifest,
    per_process_message,
    read_json,
)
from storage.table import SegmentRef, Table


class MEGStore:
    """A run's store. Open once per process; handles are cheap and picklable."""

    def __init__(self, backend: Backend, run_id: str, storage_options: dict[str, Any] | None):
        self.backend = backend
        self.run_id = run_id
        self.storage_options = storage_options
        self.root = backend.join(run_id)
        self.pid = os.getpid()
        self._tables: dict[str, Table] = {}

    @property
    def url(self) -> str:
        return self.backend.url

    @classmethod
    def open(
        cls,
        url: str,
        run_id: str,
        *,
        create: bool = True,
        storage_options: dict[str, Any] | None = None,
    ) -> MEGStore:
        backend = open_backend(url, storage_options)
        store = cls(backend, check_name("run id", run_id), storage_options)
        path = backend.join(run_id, "store.json")
        try:
            manifest = read_json(backend, path, "store manifest")
        except FileNotFoundError:
            if backend.listdir(store.root):
                raise StoreError(
                    f"{backend.url_of(store.root)} exists but is not a MEG store (no store.json); "
                    "pick another run id or store URL — nothing there was changed"
                ) from None
            if not create:
                hint = (
                    " memory:// stores are per-process: a store created in another process is"
                    " not visible here; use file:// or s3:// to share it"
                    if backend.per_process
                    else ""
                )
                raise StoreError(f"no MEG store at {backend.url_of(path)}.{hint}") from None
            backend.put_if_absent(path, new_manifest(STORE_FORMAT, run_id=run_id))
            manifest = read_json(backend, path, "store manifest")
        check_manifest(backend, path, manifest, STORE_FORMAT)
        return store

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.url, self.run_id, self.storage_options, self.pid))

    def check_process(self) -> None:
        if self.backend.per_process and os.getpid() != self.pid:
            raise StoreError(per_process_message(self.url))

    def table(self, agent: str) -> Table:
        self.check_process()
        if agent not in self._tables:
            self._tables[agent] = Table(self, check_name("agent", agent))
        return self._tables[agent]

    def agents(self) -> list[str]:
        names = self.backend.listdir(self.root)
        return [
            n for n in names if self.backend.exists(self.backend.join(self.run_id, n, "table.json"))
        ]

    @staticmethod
    def runs(url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
        backend = open_backend(url, storage_options)
        return [
            n
            for n in backend.listdir(backend.root)
            if backend.exists(backend.join(n, "store.json"))
        ]

    # -- large text by reference ---------------------------------------------------------
    def put_blob(self, data: bytes | str) -> str:
        """Store bytes content-addressed; returns a ``blob:<sha256>`` reference for a column."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        digest = hashlib.sha256(raw).hexdigest()
        self.backend.put_if_absent(self.backend.join(self.run_id, "_blobs", digest), raw)
        return f"blob:{digest}"

    def get_blob(self, ref: str) -> bytes:
        digest = ref.removeprefix("blob:")
        path = self.backend.join(self.run_id, "_blobs", digest)
        try:
            raw = self.backend.read(path)
        except FileNotFoundError:
            raise StoreError(f"blob {ref} not found at {self.backend.url_of(path)}") from None
        if hashlib.sha256(raw).hexdigest() != digest:
            raise StoreError(f"blob at {self.backend.url_of(path)} does not match its sha256 name")
        return raw


def _reopen(url: str, run_id: str, storage_options: dict[str, Any] | None, pid: int) -> MEGStore:
    if url.startswith("memory://") and os.getpid() != pid:
        # Unpickling must not raise (it would kill a process pool); use raises instead.
        store = MEGStore(open_backend(url, storage_options), run_id, storage_options)
    else:
        store = MEGStore.open(url, run_id, create=False, storage_options=storage_options)
    store.pid = pid
    return store


__all__ = ["MEGStore", "SegmentRef", "Table"]
