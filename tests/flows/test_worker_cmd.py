"""`flexmarl worker` against a real scheduler: the roles and name it declares, and the
environment its worker process gets (flows.commands_models.worker_cmd)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def scheduler() -> Iterator[str]:
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def _env() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")}


def test_a_started_worker_declares_its_role_and_name_and_keeps_malloc_defaults(
    scheduler: str,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    cmd = [sys.executable, "-m", "flows.cli", "worker", scheduler, "--role", "rollout"]
    proc = subprocess.Popen([*cmd, "--name", "w1"], env=env)
    try:
        with Client(scheduler) as client:
            client.wait_for_workers(1, timeout=120)
            (info,) = client.scheduler_info(n_workers=-1)["workers"].values()
            seen = list(client.run(_env).values())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert info["name"] == "w1" and info["resources"] == {"rollout": 1, "w1": 1}
    assert info["nthreads"] == 1
    # Dask's nanny would set 65536 here; the worker keeps glibc's defaults instead
    assert seen == [{"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": "1"}]
