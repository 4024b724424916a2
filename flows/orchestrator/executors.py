"""Two ways to run the same compiled task graph: Prefect tasks, or plain Dask futures.

The compiler (`flows.orchestrator.pipeline`) only calls `submit(kind, kwargs, pin)`,
`done/results`, and `idle(seconds)` while it waits for tasks to finish: these two sleep; the
cluster simulator's executor (`bench.sim`) advances its clock instead, so it replays this very
task graph. `PrefectExecutor` submits the Prefect task of each kind (every node becomes a task
run in the UI); `DaskExecutor` submits the same function bodies as plain Dask futures. Both pin
placement with `dask.annotate(...)` (see `flows.cluster.start.roles`); both pass dependencies as
futures inside the arguments (each resolves them before the body runs). Running one workload
through both is how the benchmark measures Prefect's orchestration overhead.

The task modules are imported where the bodies run, not here: they pull in torch and
transformers (~10 s of CPU), which the driver never needs. `DaskExecutor` submits `run_task`,
which imports the body on the worker; only `PrefectExecutor` (which hands Prefect the task
object itself) imports them on the driver, when it is made.
"""

from __future__ import annotations

import importlib
import time
import uuid
from typing import Any, Protocol

import dask

# Task kind → the module of its Prefect task. The kind is also the task's function name, its
# Prefect name, its `Timing.phase` and its Dask key prefix: one name per kind.
TASKS: dict[str, str] = {
    "generate": "tasks.rollout",
    "score": "tasks.scoring",
    "train_micro_batch": "tasks.training",
    "optimizer_step": "tasks.training",
    "hand_over": "tasks.training",
}


def task_of(kind: str) -> Any:
    """The Prefect task of `kind`, imported on first use."""
    if kind not in TASKS:
        raise KeyError(f"unknown task kind {kind!r}; known: {', '.join(TASKS)}")
    return getattr(importlib.import_module(TASKS[kind]), kind)


def run_task(kind: str, **kwargs: Any) -> Any:
    """The body of the task of `kind` (what a plain Dask future runs, on the worker)."""
    return task_of(kind).fn(**kwargs)


class Executor(Protocol):
    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Any: ...
    def done(self, handle: Any) -> bool: ...
    def results(self, handles: list[Any]) -> list[Any]: ...
    def idle(self, seconds: float) -> None: ...


class PrefectExecutor:
    """Submit through the flow's DaskTaskRunner (must be called inside the flow run)."""

    def __init__(self) -> None:
        self.tasks = {kind: task_of(kind) for kind in TASKS}

    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Any:
        with dask.annotate(**pin):
            return self.tasks[kind].submit(**kwargs)

    def done(self, handle: Any) -> bool:
        return bool(handle.wrapped_future.done())

    def results(self, handles: list[Any]) -> list[Any]:
        return [h.result() for h in handles]

    def idle(self, seconds: float) -> None:
        time.sleep(seconds)


class DaskExecutor:
    """Submit the task bodies as plain Dask futures on `client`, keyed like the task
    (`train_micro_batch-<uuid>`) so that the dashboard and the scheduler's logs name them."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Any:
        key = f"{kind}-{uuid.uuid4()}"
        with dask.annotate(**pin):
            return self.client.submit(run_task, kind, key=key, **kwargs)

    def done(self, handle: Any) -> bool:
        return bool(handle.done())

    def results(self, handles: list[Any]) -> list[Any]:
        """One gather for the batch, straight from the workers (not relayed by the
        scheduler, whose single thread also runs the pipeline's dataflow)."""
        return list(self.client.gather(handles, direct=True))

    def idle(self, seconds: float) -> None:
        time.sleep(seconds)
