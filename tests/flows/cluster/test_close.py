"""Closing a cluster the run started (`flows.cluster.close.close_local`): every worker
process is left to exit on its own, its clean-up included, instead of being killed 4 s in."""

from __future__ import annotations

import atexit
import logging
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from flows.cluster.close import close_local


def _slow_exit(marker: str, seconds: float) -> None:
    """In the worker: an exit handler that takes `seconds` (as a process that served vLLM
    engines does) and then leaves a mark that it ran to the end."""

    def leave() -> None:
        time.sleep(seconds)
        Path(marker).write_text("done")

    atexit.register(leave)


@pytest.mark.parametrize("closer", ["close_local", "cluster.close"])
def test_a_worker_slow_to_exit_finishes_its_clean_up(
    tmp_path: Path, closer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """6 s of exit handlers: `close_local` waits for them; Dask's own close kills the
    process 4 s in, with a warning, and the handler never finishes (the control arm: it
    shows the test can see a kill)."""
    marker = tmp_path / "exited"
    cluster = LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
    )
    with Client(cluster) as client:
        client.run(_slow_exit, str(marker), 6.0)
    with caplog.at_level(logging.WARNING, logger="distributed.nanny"):
        if closer == "close_local":
            close_local(cluster)
        else:
            cluster.close()
    killed = "still alive" in caplog.text
    if closer == "close_local":
        assert marker.read_text() == "done" and not killed
    else:
        assert not marker.exists() and killed


@pytest.mark.slow
def test_a_run_stopped_by_an_error_closes_its_cluster_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`dask_cluster` gives a finished run's workers their grace; a run stopped by an error
    (or Ctrl-C) closes the Dask way, a slow worker killed 4 s in, and the error goes on."""
    from flows.cluster.start import ClusterConfig, dask_cluster

    marker = tmp_path / "exited"
    with (
        caplog.at_level(logging.WARNING, logger="distributed.nanny"),
        pytest.raises(RuntimeError, match="stopped"),
        dask_cluster(ClusterConfig(colocate=True)) as workers,
    ):
        address = workers.address
        with Client(address) as client:
            client.run(_slow_exit, str(marker), 6.0)
        raise RuntimeError("stopped")
    assert "still alive" in caplog.text and not marker.exists()
    with pytest.raises(OSError):
        Client(address, timeout=2)
