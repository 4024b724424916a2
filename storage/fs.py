"""fsspec filesystems that retry like the MEG Store does, for what lives beside its tables:
StateStore states (published weights, swapped-out trainer states) and checkpoints.

``open_fs(url, storage_options)`` returns ``(fs, path)`` as ``fsspec.core.url_to_fs``
does. A local path gets fsspec's own filesystem: nothing there is transient, and a full
disk must raise at once. Anything else gets a :class:`RetryingFS`, which runs the calls in
``RETRIED`` under a :class:`storage.retry.Retrier` (per-attempt deadline, bounded backoff,
WARNING logs, counters), with the policy of ``storage_options["store_retry"]``, else of
``FLEXMARL_STORE_RETRY``, else the defaults: an S3 server restarted under a run delays a
checkpoint instead of failing the training task.

Every retried call is idempotent, with one exception handled here: a delete whose earlier
try landed (its answer lost) finds nothing the second time, so a ``FileNotFoundError``
after a failed attempt of ``rm``/``rm_file`` means done. A ``mv`` cut short and retried may
find its source gone and raise ``FileNotFoundError``; its callers (`quarantine`) read that
as "someone moved it already".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from storage.retry import RETRY_OPTION, Retrier, RetryPolicy, endpoint_of

RETRIED = frozenset(
    {"cat_file", "pipe_file", "exists", "ls", "info", "glob", "find", "makedirs"}
    | {"rm", "rm_file", "mv", "isdir", "isfile", "get_file", "put_file"}
)
_DELETES = frozenset({"rm", "rm_file"})


class RetryingFS:
    """An fsspec filesystem whose calls in ``RETRIED`` run under ``retry``; every other
    attribute is the filesystem's own. ``retry.stats`` counts what happened."""

    def __init__(self, fs: Any, retry: Retrier) -> None:
        self.fs = fs
        self.retry = retry

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.fs, name)
        return functools.partial(self._call, name, attr) if name in RETRIED else attr

    def _call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        tries = 0

        def once(timeout: float) -> Any:
            nonlocal tries
            tries += 1
            deadline = {"timeout": timeout} if self.fs.async_impl else {}
            try:
                return fn(*args, **kwargs, **deadline)
            except FileNotFoundError:
                if name in _DELETES and tries > 1:
                    return None  # an earlier try removed it
                raise

        where = self.retry.url + (args[0] if args and isinstance(args[0], str) else "")
        return self.retry.call(name, where, once)


@functools.lru_cache(maxsize=64)
def _shared_retrier(scheme: str, policy: RetryPolicy, endpoint: str) -> Retrier:
    """One Retrier (so one set of counters) per endpoint and policy in a process."""
    return Retrier(policy, f"{scheme}://", endpoint)


OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})


def fresh_listings(scheme: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with fsspec's listings cache off for an object store (unless set), and an
    S3 endpoint taken from the environment made explicit (below).

    Why: s3fs answers `info`, `exists` and (for `cat_file`, through `size`) even reads from
    its cache of directory listings. What another host commits after this process listed a
    folder is then "not found" without a request: a training worker that had listed a
    table's commits did not see the next micro-batch's segment, which a rollout worker on
    another host had committed (found by the multi-host test). Every reader here wants the
    store as it is now."""
    if scheme in OBJECT_STORES:
        options.setdefault("use_listings_cache", False)
    client = options.get("client_kwargs") or {}
    env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if (
        scheme in ("s3", "s3a")
        and env
        and not (options.get("endpoint_url") or client.get("endpoint_url"))
    ):
        # explicit, so fsspec's cache of filesystems (keyed by arguments, not by the
        # environment) never hands a client of another endpoint to this one
        options["endpoint_url"] = env
    return options


def open_fs(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """``(filesystem, path)`` of ``url``; remote filesystems retry (module docstring)."""
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    options = fresh_listings(scheme, dict(storage_options or {}))
    policy = RetryPolicy.from_options(options.pop(RETRY_OPTION, None))
    fs, path = fsspec.core.url_to_fs(url, **options)
    if isinstance(fs, LocalFileSystem):
        return fs, path
    return RetryingFS(fs, _shared_retrier(scheme, policy, endpoint_of(scheme, options))), path


def retry_stats(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The counters ``open_fs(url, storage_options)`` retries under (None for local paths)."""
    fs, _ = open_fs(url, storage_options)
    return fs.retry.stats if isinstance(fs, RetryingFS) else None
