"""Bounded, logged retries of store operations against an object store that may go away.

What the libraries already do (s3fs 2026.9, aiobotocore 3.10, botocore 1.43):

- botocore retries every HTTP request (legacy mode by default: 5 attempts, exponential
  backoff with jitter; ``config_kwargs={"retries": {...}}``), logging at DEBUG only;
- s3fs retries timeouts and broken reads up to 5 times more (``0.1·1.7^i`` s apart).

Together they ride out a blip of a second or two, not an S3 server restart. And a PUT to a
server that accepted the connection but does not answer (stopped, overloaded) hangs
forever: botocore sends ``Expect: 100-continue`` with every PutObject, and aiohttp starts
its read timeout only after the body, which it sends only after a ``100 Continue`` that
never comes.

So every backend operation runs under a :class:`RetryPolicy`: a hard deadline per attempt
(fsspec's ``timeout=``, an ``asyncio.wait_for`` on its event loop), exponential backoff
``min(base_s·2^i, max_s)`` (times a jitter in [0.5, 1]) between attempts, a WARNING per
retry and counters (:class:`RetryStats`). Only transient errors are retried (refused,
reset or closed connections, timeouts, HTTP 5xx and throttling); a missing object, a failed
precondition or a bad credential raises at once. After the last attempt a
:class:`StoreUnavailableError` names the endpoint, the operation and the budget spent.

Retrying whole operations is safe because they are idempotent: attempt folders are private,
and a put-if-absent whose earlier try did land is recognised by reading the object back
(``FsspecBackend.put_if_absent``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from storage.errors import StoreError, StoreUnavailableError

log = logging.getLogger(__name__)
# backoff jitter from a generator of its own: drawing from the global `random` would change
# the random state of the program that uses the store (its sampling, its tests)
_JITTER = random.Random()
T = TypeVar("T")

RETRY_OPTION = "store_retry"  # the storage_options key holding a RetryPolicy's fields
RETRY_ENV = "FLEXMARL_STORE_RETRY"  # the same as JSON, where there are no storage_options
_THROTTLE_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling"}
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long one store operation may keep failing before it raises.

    Worst case before the error: ``attempts × attempt_timeout_s + Σ delay(i)``; with the
    defaults a refused connection fails after 1-2 min (≤ 36 s of backoff, botocore's own
    retries take 4-9 s inside each attempt), a silent server after ≈ 9 min."""

    attempts: int = 8  # tries per operation; 1 = no retry
    base_s: float = 0.5  # backoff before the first retry
    max_s: float = 10.0  # backoff cap
    attempt_timeout_s: float = 60.0  # hard deadline of one try (a hung PUT never returns)

    def __post_init__(self) -> None:
        ok = (
            isinstance(self.attempts, int)
            and self.attempts >= 1
            and 0 <= self.base_s <= self.max_s
            and self.attempt_timeout_s > 0
        )
        if not ok:
            raise StoreError(
                f"storage_options[{RETRY_OPTION!r}] = {self!r} is not valid: attempts >= 1, "
                "0 <= base_s <= max_s, attempt_timeout_s > 0"
            )

    def delay(self, retry: int) -> float:
        """Backoff before retry number ``retry`` (0-based), jitter not included."""
        return float(min(self.base_s * 2**retry, self.max_s))

    @classmethod
    def from_options(cls, value: Any) -> RetryPolicy:
        """The policy of ``storage_options[RETRY_OPTION]`` (a dict of fields), else of the
        environment variable ``FLEXMARL_STORE_RETRY`` (the same dict as JSON: how a
        ``flexmarl train`` run, which has no storage_options, sets it), else the defaults."""
        if value is None and os.environ.get(RETRY_ENV):
            try:
                value = json.loads(os.environ[RETRY_ENV])
            except json.JSONDecodeError as e:
                raise StoreError(f"{RETRY_ENV} is not JSON: {e}") from e
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        known = {f.name for f in fields(cls)}
        if not isinstance(value, dict) or set(value) - known:
            raise StoreError(
                f"storage_options[{RETRY_OPTION!r}] (or {RETRY_ENV}) must be a dict with keys "
                f"among {sorted(known)}, got {value!r}"
            )
        return cls(**value)


@dataclass(slots=True)
class RetryStats:
    """Counters of one backend (``store.backend.retry.stats``), for tests and dashboards."""

    retries: int = 0  # attempts beyond the first, all operations together
    recovered: int = 0  # operations that succeeded after at least one retry
    gave_up: int = 0  # operations that raised StoreUnavailableError


def is_transient(exc: BaseException) -> bool:
    """Whether trying the same request again may succeed (module docstring)."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, StoreError)):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):  # incl. fsspec's FSTimeoutError
        return True
    if _library_transient(exc):
        return True
    cause = exc.__cause__  # s3fs turns an HTTP error into OSError(EIO/EREMOTEIO) from it
    if isinstance(exc, OSError) and exc.errno in (errno.EIO, errno.EREMOTEIO) and cause:
        response = getattr(cause, "response", None) or {}
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return int(status) >= 500 or response.get("Error", {}).get("Code") in _THROTTLE_CODES
    return False


def _library_transient(exc: BaseException) -> bool:
    try:
        from aiohttp import ClientConnectionError, ClientPayloadError
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:  # pragma: no cover - s3fs pulls both in
        return False
    return isinstance(
        exc, (BotoConnectionError, HTTPClientError, ClientConnectionError, ClientPayloadError)
    )


class Retrier:
    """Runs one backend's operations under its policy, counting and logging the retries."""

    def __init__(self, policy: RetryPolicy, url: str, endpoint: str) -> None:
        self.policy = policy
        self.url = url  # the store root, for messages
        self.endpoint = endpoint  # what is unreachable: endpoint_url or the provider default
        self.stats = RetryStats()

    def call(self, what: str, where: str, fn: Callable[[float], T]) -> T:
        """``fn(attempt_timeout_s)`` until it succeeds, fails for good or the budget ends."""
        t0 = time.monotonic()
        for attempt in range(self.policy.attempts):
            try:
                result = fn(self.policy.attempt_timeout_s)
            except Exception as e:
                time.sleep(self._failed(what, where, attempt, e, t0))
            else:
                return self._succeeded(what, where, attempt, result)
        raise AssertionError("unreachable")

    async def acall(self, what: str, where: str, fn: Callable[[], Awaitable[T]]) -> T:
        """The same for a coroutine (zarr's reads run on its own event loop)."""
        t0 = time.monotonic()
        for attempt in range(self.policy.attempts):
            try:
                result = await asyncio.wait_for(fn(), self.policy.attempt_timeout_s)
            except Exception as e:
                await asyncio.sleep(self._failed(what, where, attempt, e, t0))
            else:
                return self._succeeded(what, where, attempt, result)
        raise AssertionError("unreachable")

    def _failed(self, what: str, where: str, attempt: int, e: Exception, t0: float) -> float:
        """The backoff before the next attempt, or raise (not transient, or budget spent)."""
        if not is_transient(e):
            raise e
        if attempt + 1 >= self.policy.attempts:
            self.stats.gave_up += 1
            raise StoreUnavailableError(
                f"{self.endpoint} did not answer: {what} of {where} failed {attempt + 1} times "
                f"over {time.monotonic() - t0:.1f} s (last error: {type(e).__name__}: {e}). "
                f"Check the S3 endpoint {self.endpoint}, then rerun or resume — the retry "
                f"budget is storage_options[{RETRY_OPTION!r}] = {self.policy}",
                self.endpoint,
                attempt + 1,
            ) from e
        delay = self.policy.delay(attempt) * _JITTER.uniform(0.5, 1.0)
        self.stats.retries += 1
        log.warning(
            "%s: %s of %s failed (%s: %s); retry %d/%d in %.2f s",
            self.endpoint,
            what,
            where,
            type(e).__name__,
            e,
            attempt + 1,
            self.policy.attempts - 1,
            delay,
        )
        return delay

    def _succeeded(self, what: str, where: str, attempt: int, result: T) -> T:
        if attempt:
            self.stats.recovered += 1
            log.warning("%s: %s of %s done after %d retries", self.endpoint, what, where, attempt)
        return result


def endpoint_of(scheme: str, options: dict[str, Any]) -> str:
    """The server a backend talks to, for messages: its endpoint_url, or the default one."""
    client = options.get("client_kwargs") or {}
    found = (
        options.get("endpoint_url")
        or client.get("endpoint_url")
        or (scheme in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL_S3"))
        or (scheme in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL"))
    )
    return str(found) if found else f"the default {scheme}:// endpoint"


class RetryingStore(WrapperStore[Store]):
    """A read-only zarr store whose reads run under a :class:`Retrier` (segment reads)."""

    def __init__(self, store: Store, retrier: Retrier) -> None:
        super().__init__(store)
        self._retrier = retrier

    def _with_store(self, store: Store) -> RetryingStore:
        return type(self)(store, self._retrier)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        return await self._retrier.acall(
            "read", f"{self._store}/{key}", lambda: self._store.get(key, prototype, byte_range)
        )

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        ranges = list(key_ranges)
        return await self._retrier.acall(
            "read", str(self._store), lambda: self._store.get_partial_values(prototype, ranges)
        )

    async def exists(self, key: str) -> bool:
        return await self._retrier.acall(
            "exists", f"{self._store}/{key}", lambda: self._store.exists(key)
        )

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)
