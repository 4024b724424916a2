"""A run started from a Python script (flows.cluster.bootstrap): the main-module guard, and a
driver that stops waiting for local workers that failed to start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from flows.cluster.bootstrap import WorkerStartError, spawning, wait_for_local_workers
from tests.flows.conftest import write_config

ROOT = Path(__file__).resolve().parents[3]

# what a user writes first: the call at module level, no `if __name__ == "__main__":`
UNGUARDED = """
from flows.train import TrainParams, train

train(TrainParams(config={cfg!r}, run_dir={run!r}, export_final=False))
"""


@pytest.mark.slow
def test_a_script_without_the_main_guard_fails_at_once_naming_the_fix(
    tmp_path: Path, tiny_model: str, prefect_server: str
) -> None:
    """Each spawned worker re-imports the script: its import stops with the fix in the
    message, and the driver stops at the first failed worker with the fix in its error
    (before: 120 s of waiting, then `WorkerStartTimeoutError: Only 0/3 workers arrived`)."""
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=1)
    script = tmp_path / "train_it.py"
    script.write_text(UNGUARDED.format(cfg=str(cfg), run=str(tmp_path / "run")))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env={**os.environ, "PREFECT_API_URL": prefect_server},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0
    # the workers' side, naming the script
    assert f"flexmarl train was started while a Dask worker process imported {script}" in out
    # the driver's side: its own error at the first worker that failed, with the fix
    assert re.search(r"WorkerStartError: local Dask worker\(s\) (rollout|train)-\d.* failed", out)
    assert 'under `if __name__ == "__main__":`' in out
    assert "workers arrived after" not in out  # not Dask's timeout


def test_the_driver_is_not_spawning() -> None:
    assert spawning() is False


def test_workers_that_never_join_end_the_wait_with_a_count() -> None:
    """No worker failed, none joined: past the timeout, how many of how many started."""
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
        pytest.raises(WorkerStartError, match="only 0 of 1 local Dask workers started within 1 s"),
    ):
        wait_for_local_workers(cluster, client, expected=1, timeout=1)


def test_workers_that_joined_end_the_wait() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        wait_for_local_workers(cluster, client, expected=1, timeout=30)
        assert len(client.nthreads()) == 1
