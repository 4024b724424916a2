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
- A full disk (ENOSPC, EDQUOT) raises ``StoreFullError`` naming the path; a temp file the
  failed write left is removed.
- fsspec backends run every operation under a ``storage.retry.RetryPolicy`` (from
  ``storage_options["store_retry"]``): an object store that goes away and comes back is
  waited for, one that does not raises ``StoreUnavailableError`` naming the endpoint.
"""

from __future__ import annotations

import errno
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, TypeVar

import fsspec
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore

from meg.registry import Registry
from storage.errors import StoreError, StoreFullError
from storage.fs import fresh_listings
from storage.retry import RETRY_OPTION, Retrier, RetryingStore, RetryPolicy, endpoint_of

T = TypeVar("T")
FULL_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}


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


@contextmanager
def full_disk(path: str) -> Iterator[None]:
    """Turn "no space left on device" (or "quota exceeded") into a StoreFullError naming
    ``path``: a bare OSError from deep inside a write says neither where nor what to do."""
    try:
        yield
    except OSError as e:
        if e.errno not in FULL_ERRNOS:
            raise
        raise StoreFullError(
            f"no space left writing {path} ({FULL_ERRNOS[e.errno]}: {e.strerror}); nothing "
            "of this write is visible to readers — free space (or raise the quota), then "
            "run the same write again (resume the run)",
            path,
            e.errno,
        ) from e


def _unlink_quietly(path: str) -> None:
    with suppress(OSError):
        os.unlink(path)


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
        tmp = f"{path}.{uuid.uuid4().hex}.partial"
        with full_disk(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
            except BaseException:
                _unlink_quietly(tmp)  # a cut-short temp file would hold the space it got
                raise
        return tmp

    def write(self, path: str, data: bytes) -> None:
        os.replace(self._tmp(path, data), path)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        tmp = self._tmp(path, data)
        try:
            with full_disk(path):
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
            with full_disk(path):
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
    a process-local lock for memory://, and check-then-put elsewhere (documented race).
    Every operation runs under the backend's Retrier (storage.retry); ``memory://`` never
    fails transiently, so there it costs one function call."""

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        scheme, rest = split_scheme(url)
        options = fresh_listings(scheme, dict(storage_options))
        policy = RetryPolicy.from_options(options.pop(RETRY_OPTION, None))
        self.scheme = scheme
        self.storage_options = options  # what fsspec gets: without our retry policy
        self.fs = fsspec.filesystem(scheme, **options)
        self.root = rest.rstrip("/")
        self.url = f"{scheme}://{self.root}"
        self.per_process = scheme == "memory"
        self.retry = Retrier(policy, self.url, endpoint_of(scheme, options))

    def _do(self, what: str, path: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` under the retry policy; an async filesystem gets the
        per-attempt deadline as fsspec's ``timeout=`` (its sync wrapper cancels on expiry)."""

        def once(timeout: float) -> T:
            deadline = {"timeout": timeout} if self.fs.async_impl else {}
            with full_disk(self.url_of(path)):
                return fn(*args, **kwargs, **deadline)

        return self.retry.call(what, self.url_of(path), once)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def read(self, path: str) -> bytes:
        return bytes(self._do("read", path, self.fs.cat_file, path))

    def write(self, path: str, data: bytes) -> None:
        self._do("write", path, self.fs.pipe_file, path, data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        if self.scheme in ("s3", "s3a"):
            try:
                self._do("commit", path, self.fs.pipe_file, path, data, mode="create")
                return True
            except (FileExistsError, OSError) as e:
                return self._settle(path, data, e)
        with _MEMORY_LOCK:  # exact for memory://; best effort for other fsspec stores
            if self._exists_fresh(path):
                return self._read_fresh(path) == data  # ours, if an earlier try landed
            self._do("commit", path, self.fs.pipe_file, path, data)
            return True

    def _settle(self, path: str, data: bytes, e: OSError) -> bool:
        """After a refused conditional put: did *our* bytes land (a retried request whose
        first try succeeded, or a request the server ran after the client gave up on it)?
        Reading the object back decides; the marker and manifest bytes are unique per
        attempt (attempt id, time), so equal bytes mean ours."""
        found = self._read_fresh(path)
        if found is not None:
            return found == data
        raise StoreError(f"could not write commit marker {self.url_of(path)}: {e}") from e

    def _read_fresh(self, path: str) -> bytes | None:
        self.fs.invalidate_cache(path)
        try:
            return self.read(path)
        except FileNotFoundError:
            return None

    def put_files(self, folder: str, files: Mapping[str, memoryview]) -> None:
        # one call: async filesystems (s3) put the files concurrently
        payload = {f"{folder}/{rel}": bytes(data) for rel, data in files.items()}
        self._do("write", folder, self.fs.pipe, payload)

    def _exists_fresh(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return bool(self._do("exists", path, self.fs.exists, path))

    def exists(self, path: str) -> bool:
        return self._exists_fresh(path)

    def listdir(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)
        try:
            entries = self._do("list", path, self.fs.ls, path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def rm_tree(self, path: str) -> None:
        if self._exists_fresh(path):
            with suppress(FileNotFoundError):  # a retried removal whose first try got there
                self._do("remove", path, self.fs.rm, path, recursive=True)

    def url_of(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def zarr_store(self, path: str, *, read_only: bool) -> Store:
        store = FsspecStore.from_url(
            self.url_of(path), storage_options=self.storage_options or None, read_only=read_only
        )
        return RetryingStore(store, self.retry)
