"""Two runs on one shared cluster: the second is refused at start, naming the first; a
driver killed without closing frees the cluster after the lease timeout (flows/cluster/lease.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cluster.lease import cluster_lease
from flows.cluster.start import ClusterConfig
from flows.runs.record import RunError
from flows.train import TrainParams, train
from tests.flows.conftest import write_config

pytestmark = pytest.mark.slow


def test_a_second_run_is_refused_naming_the_first(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    cfg = write_config(tmp_path, tiny_model)
    params = TrainParams(
        config=str(cfg),
        run_dir=str(tmp_path / "second"),
        cluster=ClusterConfig(scheduler=cluster),
        export_final=False,
    )
    with cluster_lease(cluster, "math-chain-first", "/runs/first"), pytest.raises(RunError) as e:
        train(params)
    msg = str(e.value)
    assert f"the Dask cluster at {cluster} is in use by run math-chain-first" in msg
    assert "run dir /runs/first" in msg and "lease timeout (30s)" in msg
    assert not (tmp_path / "second" / "timeline.json").exists()  # no step ran
    with cluster_lease(cluster, "third", "/runs/third"):  # released: the next one starts
        pass


def test_a_killed_driver_frees_the_cluster_after_the_lease_timeout(tmp_path: Path) -> None:
    import dask
    from distributed import LocalCluster

    fast = {
        "distributed.scheduler.locks.lease-validation-interval": "0.2s",
        "distributed.scheduler.locks.lease-timeout": "2s",
    }
    with (
        dask.config.set(fast),
        LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address="127.0.0.1:0") as local,
    ):
        code = (
            "import sys, time\n"
            "from flows.cluster.lease import cluster_lease\n"
            f"held = cluster_lease({local.scheduler_address!r}, 'killed-run', '/runs/k')\n"
            "held.__enter__()\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n"
        )
        env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "2s"}
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
            refused = pytest.raises(RunError, match="in use by run killed-run")
            with refused, cluster_lease(local.scheduler_address, "next", "/runs/n"):
                pass
        finally:
            proc.kill()  # the driver dies without closing its client
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                with cluster_lease(local.scheduler_address, "next", "/runs/n"):
                    break
            except RunError:
                assert time.monotonic() < deadline, "the dead driver's lease was never freed"
                time.sleep(0.5)
