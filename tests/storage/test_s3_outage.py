"""An S3 server that goes away mid-run, with real processes: a moto server SIGSTOPped and
continued (it hangs, then answers, keeping its state), and a TCP proxy in front of moto
killed and started again (connections refused, open ones reset). Store operations wait,
retry with bounded backoff (counted and logged) and finish with the right data; a server
that never comes back raises StoreUnavailableError naming the endpoint.

No wall clock in the assertions: the outage ends only once the test has seen the store
retry (`backend.retry.stats`), so every outage is observed whatever the machine's load."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from storage.errors import StoreError, StoreUnavailableError
from storage.retry import RETRY_ENV, RETRY_OPTION, RetryPolicy
from storage.schema import SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch
from tests.storage.conftest import Proxy, moto_server, new_bucket, s3_options

FAST = {"attempts": 40, "base_s": 0.05, "max_s": 0.5, "attempt_timeout_s": 2.0}
QUICK_BOTO = {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 2}}


def open_store(endpoint: str, bucket: str, **policy: Any) -> MEGStore:
    options = {
        **s3_options(endpoint),
        "config_kwargs": QUICK_BOTO,
        RETRY_OPTION: {**FAST, **policy},
    }
    return MEGStore.open(f"s3://{bucket}/store", "run", storage_options=options)


def when(cond: Callable[[], bool], then: Callable[[], None]) -> threading.Thread:
    """Run `then` in a thread as soon as `cond()` holds (polled); the outage's other end."""

    def go() -> None:
        deadline = time.monotonic() + 300
        while not cond():
            assert time.monotonic() < deadline, "the store never retried"
            time.sleep(0.05)
        then()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def batch(step: int) -> Any:
    return synthetic_batch(SegmentKey(step, 0, "solve"), seed=step)


def test_put_if_absent_recognises_its_own_landed_write(moto_endpoint: str) -> None:
    """A retried conditional put whose first try landed (the server answered too late, or
    its answer was lost) is refused with 412: reading the object back tells it was ours."""
    store = open_store(moto_endpoint, new_bucket(moto_endpoint))
    b = store.backend
    path = b.join("run", "solver", "commits", "k000000-m0000-solve.json")
    assert b.put_if_absent(path, b"marker of attempt a1") is True
    assert b.put_if_absent(path, b"marker of attempt a1") is True  # the retry: ours
    assert b.put_if_absent(path, b"marker of attempt a2") is False  # someone else's
    assert b.read(path) == b"marker of attempt a1"


def test_proxy_killed_and_restarted_mid_sequence(
    proxy: Proxy, moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(proxy.endpoint, new_bucket(moto_endpoint))
    table = store.table("solver")
    stats = store.backend.retry.stats  # type: ignore[attr-defined]
    table.write_segment(SegmentKey(0, 0, "solve"), batch(0))
    with caplog.at_level(logging.WARNING, logger="storage.retry"):
        proxy.kill()  # a write and a listing into the outage
        seen = stats.retries  # (a loaded machine may have timed out a request already)
        back = when(lambda: stats.retries >= seen + 3, proxy.start)
        ref = table.write_segment(SegmentKey(1, 0, "solve"), batch(1))
        assert [i.segment_id for i in table.segments()] == [
            "k000000-m0000-solve",
            "k000001-m0000-solve",
        ]
        back.join()
        proxy.kill()  # a read of segment data (zarr's path) into the outage
        seen = stats.retries
        back = when(lambda: stats.retries >= seen + 3, proxy.start)
        rows = table.read(segments=[ref])
        back.join()
    np.testing.assert_array_equal(rows.response_ids, batch(1).response_ids)
    np.testing.assert_array_equal(table.read(step=0).response_ids, batch(0).response_ids)
    assert stats.recovered >= 2 and stats.gave_up == 0
    assert f"{proxy.endpoint}: " in caplog.text and "retry 1/39" in caplog.text


@pytest.fixture
def own_moto() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    with moto_server() as server:  # its own: a stopped server must not stall other tests
        yield server


def test_server_stopped_and_continued_mid_sequence(
    own_moto: tuple[subprocess.Popen[bytes], str],
) -> None:
    """SIGSTOP: the server accepts connections and answers nothing (a PUT would wait
    forever for `100 Continue`: only the per-attempt deadline ends it); SIGCONT: it runs the
    requests it had queued, including some the client gave up on, then the retries."""
    proc, endpoint = own_moto
    store = open_store(endpoint, new_bucket(endpoint))
    table = store.table("solver")
    stats = store.backend.retry.stats  # type: ignore[attr-defined]
    stopped, errors = threading.Event(), []

    def writer() -> None:
        try:
            for k in range(6):
                if k == 2:
                    stopped.wait()
                table.write_segment(SegmentKey(k, 0, "solve"), batch(k))
                got = table.read(step=k).response_ids
                np.testing.assert_array_equal(got, batch(k).response_ids)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        while not table.segments(step=1) and t.is_alive():
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)
        seen = stats.retries
        stopped.set()
        while stats.retries < seen + 2 and t.is_alive():
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    t.join(timeout=300)
    assert not t.is_alive() and not errors, errors
    assert stats.retries >= 2 and stats.recovered >= 1 and stats.gave_up == 0
    fresh = MEGStore.open(
        store.url, "run", create=False, storage_options=store.storage_options
    ).table("solver")
    for k in range(6):  # one committed attempt each, its data there: nothing lost or doubled
        (info,) = fresh.segments(step=k)
        assert fresh.backend.listdir(fresh._p("segments", info.segment_id)) == [info.attempt]
        np.testing.assert_array_equal(fresh.read(step=k).response_ids, batch(k).response_ids)


def test_a_server_that_never_comes_back(proxy: Proxy, moto_endpoint: str) -> None:
    store = open_store(proxy.endpoint, new_bucket(moto_endpoint), attempts=3)
    table = store.table("solver")
    stats = store.backend.retry.stats  # type: ignore[attr-defined]
    key = SegmentKey(0, 0, "solve")
    proxy.kill()
    before = stats.retries  # (a loaded machine may have timed out a request already)
    with pytest.raises(StoreUnavailableError, match=rf"^{proxy.endpoint} did not answer") as e:
        table.write_segment(key, batch(0))
    assert e.value.endpoint == proxy.endpoint and e.value.attempts == 3
    assert "failed 3 times" in str(e.value) and "store_retry" in str(e.value)
    assert (stats.retries - before, stats.gave_up) == (2, 1)
    proxy.start()  # the operator fixes the endpoint; the run resumes: the same write commits
    table.write_segment(key, batch(0))
    np.testing.assert_array_equal(table.read().response_ids, batch(0).response_ids)


def test_retry_policy_comes_from_storage_options_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert RetryPolicy.from_options(None) == RetryPolicy()
    assert RetryPolicy.from_options({"attempts": 3}).attempts == 3
    monkeypatch.setenv(RETRY_ENV, '{"attempts": 20, "max_s": 30}')  # a `flexmarl train` run
    assert RetryPolicy.from_options(None) == RetryPolicy(attempts=20, max_s=30)
    assert RetryPolicy.from_options({"attempts": 2}).attempts == 2  # the options win
    assert [RetryPolicy(base_s=1, max_s=4).delay(i) for i in range(4)] == [1, 2, 4, 4]
    with pytest.raises(StoreError, match="keys among"):
        RetryPolicy.from_options({"tries": 3})
    with pytest.raises(StoreError, match="attempts >= 1"):
        RetryPolicy.from_options({"attempts": 0})
    monkeypatch.setenv(RETRY_ENV, "{")
    with pytest.raises(StoreError, match=f"{RETRY_ENV} is not JSON"):
        RetryPolicy.from_options(None)
