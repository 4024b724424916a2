"""Byte-level storage backends behind one small interface (file, memory, any fsspec URL).

The store needs only a handful of operations from a backend: read/write small objects,
an *exclusive* put (the commit point: first committed attempt wins), listing one
directory, and a Zarr store rooted at a path. Each backend runs the same conformance
suite (tests/storage/test_conformance.py).

Sharp edges:
- ``memory://`` lives in one process's memory (fsspec's MemoryFileSystem): a second
  process sees an empty store. Handles created from it refuse to work in another process.
- ``s3://`` exclusive put uses ``If-None-Match: *`` (AWS S3 since 2024, moto, MinIO).
- Listings on object stores are never cached here: new commits by other writers must show.
- ``put_files`` writes many new files under a fresh, private folder (a segment attempt)
  without per-file atomicity: nothing reads that folder before its commit marker exists.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import fsspec
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore

from meg.registry import Registry
from storage.errors import StoreError


class Backend(Protocol):
    """What the MEG Store needs from a place that holds bytes. Paths are backend-native."""

    url: str  # the root URL, normalised (file:///abs, memory://x, s3://bucket/prefix)
    root: str  # the root as a backend-native path
    per_process: bool

    def join(self, *parts: str) -> str: ...
    def url_of(self, path: str) -> str: ...  # for error messages and references
    def read(self, path: str) -> bytes: ...  # FileNotFoundError when absent
    def write(self, path: str, data: bytes) -> None: ...  # atomic replace
    def put_if_absent(self, path: str, data: bytes) -> bool: ...  # False if it existed
    def put_files(self, folder: str, files: Mapping[str, memoryview]) -> None: ...  # see below
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...  # child names; [] when absent
    def rm_tree(self, path: str) -> None: ...
    def zarr_store(self, path: str, *, read_only: bool) -> Store: ...


BACKENDS: Registry[Callable[[str, dict[str, Any]], Backend]] = Registry("store URL scheme")


def register_backend(*schemes: str) -> Callable[[Any], Any]:
    """Decorator: the backend factory for these URL schemes (`*`: every other scheme)."""
    return BACKENDS.register(*schemes)


def split_scheme(url: str) -> tuple[str, str]:
    """``"s3://b/p"`` → ``("s3", "b/p")``; a plain path is ``file``."""
    if "://" not in url:
        return "file", url
    scheme, rest = url.split("://", 1)
    return scheme, rest


def open_backend(url: str, storage_options: dict[str, Any] | None = None) -> Backend:
    scheme, _ = split_scheme(url)
    factory = BACKENDS.get(scheme if scheme in BACKENDS else "*")
    return factory(url, dict(storage_options or {}))


@register_backend("file")
class LocalBackend:
    """Local disk via ``os``: temp file + rename for writes, ``link`` for exclusive put."""

    per_process = False

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        path = split_scheme(url)[1]
        self.root = str(Path(path).expanduser().absolute())
        self.url = "file://" + self.root

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def url_of(self, path: str) -> str:
        return path

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def _tmp(self, path: str, data: bytes) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.partial"
        with open(tmp, "wb") as f:
            f.write(data)
        return tmp

    def write(self, path: str, data: bytes) -> None:
        os.replace(self._tmp(path, data), path)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        tmp = self._tmp(path, data)
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if path exists
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def put_files(self, folder: str, files: Mapping[str, memoryview]) -> None:
        made: set[str] = set()
        for rel, data in files.items():
            path = os.path.join(folder, rel)
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            with open(path, "xb") as f:  # "x": a fresh attempt folder never has the file
                f.write(data)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(path) if not n.endswith(".partial"))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def rm_tree(self, path: str) -> None:
        import shutil

        shutil.rmtree(path, ignore_errors=True)

    def zarr_store(self, path: str, *, read_only: bool) -> Store:
        return LocalStore(path, read_only=read_only)


_MEMORY_LOCK = threading.Lock()


@register_backend("*")
class FsspecBackend:
    """Any fsspec filesystem (s3, memory, gcs, ...). Exclusive put: S3 conditional write,
    a process-local lock for memory://, and check-then-put elsewhere (documented race)."""

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        scheme, rest = split_scheme(url)
        self.scheme = scheme
        self.storage_options = storage_options
        self.fs = fsspec.filesystem(scheme, **storage_options)
        self.root = rest.rstrip("/")
        self.url = f"{scheme}://{self.root}"
        self.per_process = scheme == "memory"

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def read(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        if self.scheme in ("s3", "s3a"):
            try:
                self.fs.pipe_file(path, data, mode="create")
                return True
            except (FileExistsError, OSError) as e:
                if self._exists_fresh(path):
                    return False
                raise StoreError(f"could not write commit marker {self.url_of(path)}: {e}") from e
        with _MEMORY_LOCK:  # exact for memory://; best effort for other fsspec stores
            if self._exists_fresh(path):
                return False
            self.fs.pipe_file(path, data)
            return True

    def put_files(self, folder: str, files: Mapping[str, memoryview]) -> None:
        # one call: async filesystems (s3) put the files concurrently
        self.fs.pipe({f"{folder}/{rel}": bytes(data) for rel, data in files.items()})

    def _exists_fresh(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def exists(self, path: str) -> bool:
        return self._exists_fresh(path)

    def listdir(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def rm_tree(self, path: str) -> None:
        if self._exists_fresh(path):
            self.fs.rm(path, recursive=True)

    def url_of(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def zarr_store(self, path: str, *, read_only: bool) -> Store:
        return FsspecStore.from_url(
            self.url_of(path), storage_options=self.storage_options or None, read_only=read_only
        )
