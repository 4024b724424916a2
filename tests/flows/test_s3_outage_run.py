"""A whole training run whose S3 server stops answering mid-run (a moto server SIGSTOPped
for longer than one request's deadline, then continued): the store, the StateStore and the
checkpoints retry under FLEXMARL_STORE_RETRY, and the run finishes with a clean audit."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.retry import RETRY_ENV
from storage.store import MEGStore
from tests.flows.conftest import write_config
from tests.storage.conftest import moto_server, new_bucket

pytestmark = pytest.mark.slow


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, str]]:
    """A moto server of this test's own, reached through the environment (so the local
    cluster this run starts inherits it), with a quick retry policy."""
    with moto_server() as (proc, endpoint):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        policy = '{"attempts": 60, "base_s": 0.1, "max_s": 1.0, "attempt_timeout_s": 3.0}'
        monkeypatch.setenv(RETRY_ENV, policy)
        yield proc.pid, endpoint
        os.kill(proc.pid, signal.SIGCONT)  # never leave it stopped


def consumed(fs: Any, bucket: str, step: int) -> bool:
    return len(fs.glob(f"{bucket}/store/*/*/consumed/{step}.json")) == 2  # solver, verifier


def test_a_run_rides_out_its_s3_server_stopping(
    tmp_path: Path, tiny_model: str, s3: tuple[int, str], prefect_server: str
) -> None:
    pid, endpoint = s3
    bucket = new_bucket(endpoint)
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=4)
    outage: dict[str, bool] = {}

    def stop_mid_run() -> None:
        import s3fs

        # one client, listings never cached (a new client for every poll cost 0.2 s of CPU)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
        deadline = time.monotonic() + 600
        while not consumed(fs, bucket, 0) and time.monotonic() < deadline:
            time.sleep(0.3)
        outage["mid_run"] = not consumed(fs, bucket, 3)  # the last step still to come
        os.kill(pid, signal.SIGSTOP)  # connections accepted, nothing answered
        time.sleep(8)  # longer than one attempt's deadline: requests time out and retry
        os.kill(pid, signal.SIGCONT)
        outage["done"] = True

    t = threading.Thread(target=stop_mid_run, daemon=True)
    t.start()
    out = train(
        TrainParams(
            config=str(cfg),
            run_dir=str(tmp_path / "run"),
            store=f"s3://{bucket}/store",
            export_final=False,
            # a cluster of its own (its workers inherit the S3 settings above), of the two
            # workers the weights travel between: the layout's second rollout worker was
            # one more process to start and no more S3 traffic of another kind
            cluster=ClusterConfig(rollout_workers=1),
        )
    )
    t.join(timeout=60)
    assert outage == {"mid_run": True, "done": True}
    assert out["steps"] == 4 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)  # from the store alone, after the outage
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    assert audit.steps_checked == 8  # 2 agents × 4 steps
