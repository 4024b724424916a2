"""Two ways to run the same compiled task graph: Prefect tasks, or plain Dask futures.

The compiler (`flows.pipeline`) only calls `submit(kind, kwargs, pin)`, `done/results`, and
`idle(seconds)` while it waits for tasks to finish: these two sleep; the cluster simulator's
executor (`bench.sim`) advances its clock instead, so it replays this very task graph.
`PrefectExecutor` submits the Prefect task of each kind (every node becomes a task run in the
UI); `DaskExecutor` submits the same function bodies as plain Dask futures. Both pin placement
with `dask.annotate(...)` (see `flows.cluster.roles`); both pass dependencies as futures inside
the arguments (each resolves them before the body runs). Running one workload through both is
how the benchmark measures Prefect's orchestration overhead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import dask

from tasks.rollout import generate
from tasks.scoring import score
from tasks.training import optimizer_step, train

TASKS: dict[str, Any] = {
    "generate": generate,
    "score": score,
    "train": train,
    "step": optimizer_step,
}


class Executor(Protocol):
    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Any: ...
    def done(self, handle: Any) -> bool: ...
    def results(self, handles: list[Any]) -> list[Any]: ...
    def idle(self, seconds: float) -> None: ...


class PrefectExecutor:
    """Submit through the flow's DaskTaskRunner (must be called inside the flow run)."""

    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Any:
        with dask.annotate(**pin):
            return TASKS[kind].submit(**kwargs)

    def done(self, handle: Any) -> bool:
        return bool(handle.wrapped_future.done())

    def results(self, handles: list[Any]) -> list[Any]:
        return [h.result() for h in handles]

    def idle(self, seconds: float) -> None:
        time.sleep(seconds)


class DaskExecutor:
    """Submit the task bodies (`task.fn`) as plain Dask futures on `client`."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Any:
        fn: Callable[..., Any] = TASKS[kind].fn
        with dask.annotate(**pin):
            return self.client.submit(fn, pure=False, **kwargs)

    def done(self, handle: Any) -> bool:
        return bool(handle.done())

    def results(self, handles: list[Any]) -> list[Any]:
        """One gather for the batch, straight from the workers (not relayed by the
        scheduler, whose single thread also runs the pipeline's dataflow)."""
        return list(self.client.gather(handles, direct=True))

    def idle(self, seconds: float) -> None:
        time.sleep(seconds)
