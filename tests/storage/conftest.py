"""Fixtures: one real S3-compatible server (moto) per session, the three backends, and a TCP
proxy in front of moto that a test kills and restarts (an S3 outage)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """Block until `proc` accepts connections on 127.0.0.1:`port` (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


@contextmanager
def moto_server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A moto S3 server process on 127.0.0.1 (a real HTTP server, not in-process mocks)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(port, proc, "moto server")
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.kill()  # SIGKILL works on a SIGSTOPped server too
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """The session's moto server (tests that stop a server start their own)."""
    with moto_server() as (_, endpoint):
        yield endpoint


def s3_options(endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}


def new_bucket(endpoint: str) -> str:
    import s3fs

    name = f"b-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**s3_options(endpoint)).mkdir(name)
    return name


@pytest.fixture(params=["file", "memory", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any] | None]:
    """(store URL, storage_options) for each backend; every conformance test runs on all."""
    kind = request.param
    if kind == "file":
        return f"file://{tmp_path}/store", None
    if kind == "memory":
        return f"memory://t-{uuid.uuid4().hex[:12]}", None
    endpoint = request.getfixturevalue("moto_endpoint")
    return f"s3://{new_bucket(endpoint)}/store", s3_options(endpoint)


class Proxy:
    """`python -m tests.storage._proxy` on a fixed port in front of `target`."""

    def __init__(self, target: str) -> None:
        self.port = _free_port()
        self.target_port = int(target.rsplit(":", 1)[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [sys.executable, "-m", "tests.storage._proxy", str(self.port), str(self.target_port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=os.getcwd())
        wait_listening(self.port, self.proc, "proxy")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[Proxy]:
    p = Proxy(moto_endpoint)
    yield p
    if p.proc is not None and p.proc.poll() is None:
        p.kill()
