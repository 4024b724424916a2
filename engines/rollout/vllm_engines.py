"""vLLM engines of one process, and when they may be torn down.

vLLM engines in one process share global state (the parallel groups). When an in-process
engine is garbage-collected, its finalizer tears that state down
(`cleanup_dist_env_and_memory`), and every *other* engine of the process then fails its next
step with "pipeline model parallel group is not initialized" (seen in Dask workers that
replaced a crashed host, and in a test suite that built a second engine beside a shared
one). So a backend that dies while others live parks its engine here, and the parked engines
are shut down together once the last backend of the process is gone.
"""

from __future__ import annotations

import threading
from typing import Any


class Engines:
    """This process's live vLLM backends and the engines parked until none is left (see
    the module docstring)."""

    def __init__(self) -> None:
        self.live = 0
        self.parked: list[Any] = []
        self.lock = threading.Lock()

    def opened(self) -> None:
        with self.lock:
            self.live += 1

    def closed(self, llm: Any) -> None:
        """A backend was collected: keep its engine while another backend lives."""
        with self.lock:
            self.live -= 1
            if self.live > 0:
                self.parked.append(llm)
                return
            released, self.parked = [*self.parked, llm], []
        for engine in released:  # none left: tear them down now, not at some later gc
            _shut_down(engine)


def _shut_down(llm: Any) -> None:
    """Shut an in-process engine down now. Its own finalizer would do the same whenever the
    garbage collector reaches it (the engine holds reference cycles), possibly after a new
    engine was built, and tear the global state down under that one; `shutdown` detaches it."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


ENGINES = Engines()
