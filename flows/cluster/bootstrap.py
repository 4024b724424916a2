"""Starting a local cluster from a Python script: the main-module guard, and failing fast.

Dask starts a local cluster's workers with multiprocessing's `spawn`, and a spawned process
imports its parent's main module (as `__mp_main__`) before it runs anything else. A script
that calls `flows.train.train(...)` at module level, without `if __name__ == "__main__":`,
therefore starts a whole run again inside every worker it spawns. Before these checks the
workers died, the driver waited out its 120 s for them and ended with `WorkerStartTimeoutError:
Only 0/3 workers arrived`, which names neither the cause nor the fix.

Now both sides say it: the worker's import stops at once with the fix in its message
(`refuse_while_spawning`), and the driver stops waiting as soon as one of its local workers
has failed to start (`wait_for_local_workers`).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from typing import Any

GUARD_HINT = (
    'a script that starts a run must do it under `if __name__ == "__main__":` (Dask spawns '
    "its local workers, and each imports the script's main module first; docs/clusters.md)"
)


class WorkerStartError(RuntimeError):
    """A local worker process failed to start; its own error is in the log above."""


def spawning() -> bool:
    """Whether this process is a spawned child still importing its parent's main module
    (multiprocessing's bootstrap, where starting processes is refused anyway)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def refuse_while_spawning(what: str) -> None:
    """Stop `what` (a run, a cluster) from starting in a worker that is importing the
    driver's script, with the fix in the message."""
    if spawning():
        module = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
        main = getattr(module, "__file__", None) or "the main module"
        raise RuntimeError(
            f"{what} was started while a Dask worker process imported {main}: {GUARD_HINT}"
        )


def wait_for_local_workers(cluster: Any, client: Any, expected: int, timeout: float) -> None:
    """Wait until `expected` workers of the local `cluster` have joined its scheduler; raise
    `WorkerStartError` as soon as one of them has failed to start (instead of at the
    timeout), or when they have not all joined within `timeout` seconds."""
    from distributed.core import Status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(client.nthreads()) >= expected:
            return
        failed = sorted(
            str(name)
            for name, worker in list(cluster.workers.items())
            if worker.status in (Status.failed, Status.closed)
        )
        if failed:
            raise WorkerStartError(
                f"local Dask worker(s) {', '.join(failed)} failed to start (their error is "
                f"in the log above); if this run was started from a Python script: {GUARD_HINT}"
            )
        time.sleep(0.2)
    raise WorkerStartError(
        f"only {len(client.nthreads())} of {expected} local Dask workers started within "
        f"{timeout:.0f} s (their logs are above)"
    )
