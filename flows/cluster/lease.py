"""One run at a time on a shared Dask cluster, or a clear refusal.

Every worker keeps the models and trainers of the run it serves and drops those of any
other run that asks (memory must not grow on a long-lived cluster, `tasks.worker`). Two
runs at once on one cluster would evict each other's models and trainers on every task:
silently slow, and each other's published weights reloaded over and over. So a run on a
cluster it did not start first takes the cluster's lease, a `distributed.Lock` held by the
driver's client for the whole run, and says who it is in a `distributed.Variable`. A
second run is refused at start with the first one's run id, driver host, run directory and
start time.

The lock is lease-based: a driver killed without closing stops refreshing it, and the
scheduler frees it after `distributed.scheduler.locks.lease-timeout` (30 s by default), so
`--resume` of a killed run may have to wait that long.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flows.runs.record import RunError

LEASE = "flexmarl-cluster-lease"
HOLDER = "flexmarl-cluster-holder"


@contextmanager
def cluster_lease(address: str, run_id: str, run_dir: str) -> Iterator[None]:
    """Hold the cluster at `address` for run `run_id` until the block ends (module doc)."""
    import dask
    from distributed import Client, Lock, Variable

    with Client(address, set_as_default=False) as client:
        lock = Lock(LEASE, scheduler_rpc=client.scheduler, loop=client.loop)
        holder = Variable(HOLDER, client=client)
        if not lock.acquire(timeout=2):
            timeout = dask.config.get("distributed.scheduler.locks.lease-timeout")
            raise RunError(refusal(address, _read(holder), timeout))
        try:
            holder.set(
                {
                    "run_id": run_id,
                    "run_dir": run_dir,
                    "driver": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
            yield
        finally:
            holder.delete()
            lock.release()


def _read(holder: Any) -> dict[str, str] | None:
    try:
        value = holder.get(timeout=5)
    except Exception:  # gone between the refusal and this read, or never set
        return None
    return value if isinstance(value, dict) else None


def refusal(address: str, holder: dict[str, str] | None, lease_timeout: str) -> str:
    """The error a second run gets: who holds the cluster, and what to do."""
    who = (
        f"run {holder['run_id']} (driver {holder['driver']}, run dir {holder['run_dir']}, "
        f"since {holder['since']})"
        if holder
        else "another run"
    )
    return (
        f"the Dask cluster at {address} is in use by {who}; FlexMARL runs one run at a time "
        "on a cluster (each would evict the other's models and trainers). Wait for it, stop "
        "it, or start another scheduler. A run killed without closing frees the cluster "
        f"within the scheduler's lease timeout ({lease_timeout})."
    )
