"""Closing a local cluster that a run started: its workers leave on their own."""

from __future__ import annotations

import asyncio
from typing import Any

EXIT_GRACE_S = 60.0


def close_local(cluster: Any, grace: float = EXIT_GRACE_S) -> None:
    """Close a cluster this process started, giving each worker process `grace` seconds to
    leave before it is killed.

    Why not plain `cluster.close()`: its nannies wait 4 s, then kill the worker and log
    "Worker process still alive after 4.0 seconds, killing". A worker that served vLLM
    engines needs 2-3 s alone to leave its interpreter (vLLM's finalizers and teardown;
    0.1 s without vLLM), more beside other exiting workers, so that warning ended every
    `flexmarl train` run. Nothing is lost by the kill (all data is committed), but a
    warning on every run teaches users to ignore warnings, and a process left to exit runs
    its own clean-up (child processes of the reward sandboxes included). For a run that
    finished; one stopped by an error or Ctrl-C closes the Dask way (`dask_cluster`)."""

    async def close_all() -> None:
        workers = list(cluster.workers.values())
        await asyncio.gather(*(w.close(timeout=grace / 0.8) for w in workers))

    try:
        cluster.sync(close_all)
    finally:
        cluster.close()
