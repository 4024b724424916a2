"""`flexmarl worker` against a real scheduler: the roles and name it declares, and the
environment its worker process gets (flows.cli.models.worker_cmd)."""

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
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
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


def _threads() -> tuple[str | None, str | None, int]:
    import torch

    return (
        os.environ.get("OMP_NUM_THREADS"),
        os.environ.get("MKL_NUM_THREADS"),
        torch.get_num_threads(),
    )


def test_threads_reach_the_worker_s_torch(scheduler: str) -> None:
    """`--threads N`: Dask's nanny gives its workers OMP/MKL_NUM_THREADS=1 unless its own
    environment has them; `flexmarl worker` puts N there, for both (torch with MKL takes
    MKL's count)."""
    cmd = [sys.executable, "-m", "flows.cli", "worker", scheduler, "--role", "train"]
    proc = subprocess.Popen([*cmd, "--threads", "2"])
    try:
        with Client(scheduler) as client:
            client.wait_for_workers(1, timeout=120)
            (info,) = client.scheduler_info(n_workers=-1)["workers"].values()
            (seen,) = client.run(_threads).values()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert info["nthreads"] == 1  # still one task at a time
    assert tuple(seen) == ("2", "2", min(2, len(os.sched_getaffinity(0))))


def test_threads_must_be_positive() -> None:
    cmd = [sys.executable, "-m", "flows.cli", "worker", "tcp://127.0.0.1:1", "--role", "train"]
    done = subprocess.run([*cmd, "--threads", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--threads must be at least 1" in done.stderr
