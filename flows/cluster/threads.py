"""Torch's thread count on Dask workers (`ClusterConfig.threads`, `flexmarl worker`)."""

from __future__ import annotations

import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin


def worker_threads() -> int | None:
    """The torch thread count a worker's environment asks for: `OMP_NUM_THREADS`, capped at
    the cores this process may run on (threads beyond them only wait for each other)."""
    n = os.environ.get("OMP_NUM_THREADS", "")
    if not n.isdigit() or int(n) < 1:
        return None
    usable = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    cores = len(usable(0)) if usable is not None else (os.cpu_count() or 1)
    return min(int(n), cores)


class TorchThreads(WorkerPlugin):
    """A Dask worker plugin that gives torch the thread count of the worker's environment.

    Why the environment alone is not enough: Dask spawns workers, and a spawned process
    imports the driver's main module before the nanny applies its `env`. When that module
    imports torch (`python -m bench.peer_trl` does), torch has already read Dask's pre-spawn
    `OMP_NUM_THREADS=1` and keeps it: `threads=2` left the workers on one thread, silently
    (docs/peers.md#the-bug-behind-this-fixed). The
    scheduler hands a registered plugin to every worker that joins later too, so a worker
    restarted by its nanny gets it again."""

    name = "flexmarl-torch-threads"
    idempotent = True

    def setup(self, worker: Any) -> None:
        n = worker_threads()
        if n is not None:
            import torch

            torch.set_num_threads(n)
