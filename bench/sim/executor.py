"""A discrete-event `Executor`: the compiled task graph runs on simulated workers.

`flows.orchestrator.pipeline.Pipeline` only talks to its executor through `submit(kind, kwargs,
pin)`, `done(handle)`, `results(handles)` and `idle(seconds)`. `SimExecutor` implements exactly
that, so the simulator runs the very graph the pipeline compiles, with the same balancer,
priorities, windows and failure budget; only the task bodies are replaced (`Bodies`: a cost
model that says how long a task takes and builds the result the real body would return).

Semantics, copied from how Dask runs our graph (`flows.cluster.start`: one thread per worker,
tasks pinned by a resource named after the worker):

- dependencies are the handles found in the kwargs (`after`, `weights`, `trains`, ...),
  nested in tuples, lists and dicts; anything else (a finished result passed as a value
  by `Pipeline._resolved`) is not a dependency;
- a task is *ready* `dispatch_s` after its last dependency finished: the round trip through
  the scheduler. Until then its worker does not know it, which reproduces the race the
  pipeline's docstring describes (a worker that finishes a task starts the best task it
  already holds, not the one that finish made ready);
- each worker runs one task at a time: among its ready tasks, highest Dask priority first,
  then submission order (FIFO, as Dask breaks ties);
- tasks submitted at one simulated instant are dispatched together, at the next `done`,
  `results` or `idle` call: the pipeline submits a whole step before it polls;
- `cores`: None gives every worker its own hardware; a number makes running tasks share
  that many cores (processor sharing: each progresses at min(1, cores / running)), which
  is how this machine's worker processes share its CPUs (an *effective* number, fitted:
  a task also waits on I/O, during which it leaves its core to others).

The clock is simulated seconds from 0; `idle` advances it to the next task completion.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.context import Timing

EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Work:
    """What a task body costs once started: busy seconds (at full speed) and a function
    that builds the body's result from the task's simulated interval."""

    seconds: float
    make: Callable[[Timing], Any]
    phase: str = ""
    agent: str = "-"
    step: int = 0
    micro_batch: int = -1
    active: float = 1.0  # the share of the worker's accelerators busy over the task


class Bodies(Protocol):
    """The cost model behind the executor: called when a task starts on `worker`, in
    simulated-time order (so it may keep per-worker state: resident models, slots)."""

    def start(self, kind: str, kwargs: dict[str, Any], worker: str, now: float) -> Work: ...


@dataclass(eq=False, slots=True)
class SimTask:
    """The handle `submit` returns (compared by identity, as the pipeline does)."""

    seq: int
    kind: str
    kwargs: dict[str, Any]
    worker: str
    priority: int
    deps: tuple[SimTask, ...]
    ready_at: float | None = None
    start: float | None = None
    end: float | None = None
    remaining: float = 0.0
    work: Work | None = None
    result: Any = None
    dependents: list[SimTask] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.end is not None


def handles_in(value: Any) -> Iterator[SimTask]:
    """Every SimTask inside `value` (tuples, lists, dicts, nested)."""
    if isinstance(value, SimTask):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from handles_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from handles_in(v)


def worker_of(pin: dict[str, Any]) -> str:
    """The worker a Dask pin names: its own resource (local clusters) or its address."""
    if "resources" in pin:
        (name,) = pin["resources"]
        return str(name)
    return str(pin["workers"][0])


class SimExecutor:
    """Discrete-event executor over named workers; see the module docstring."""

    def __init__(
        self,
        bodies: Bodies,
        workers: tuple[str, ...],
        dispatch_s: float = 0.0,
        cores: float | None = None,
        keep_edge: Callable[[SimTask, SimTask], bool] | None = None,
    ) -> None:
        """`keep_edge(dependency, task)`: a what-if filter on the compiled graph's edges
        (None: every edge is kept, the graph runs exactly as compiled)."""
        self.bodies, self.dispatch_s, self.cores = bodies, dispatch_s, cores
        self.keep_edge = keep_edge
        self.now = 0.0
        self.queued: dict[str, list[SimTask]] = {w: [] for w in workers}
        self.running: dict[str, SimTask] = {}
        self.finished: list[SimTask] = []
        self.active: dict[Timing, float] = {}  # tasks that kept part of their worker idle
        self._seq = itertools.count()
        self._fresh = False  # submissions since the last dispatch

    # ---- the Executor protocol ----------------------------------------------------------
    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> SimTask:
        worker = worker_of(pin)
        if worker not in self.queued:
            raise KeyError(f"task pinned to unknown worker {worker!r}; known: {list(self.queued)}")
        deps = tuple(dict.fromkeys(handles_in(kwargs)))
        task = SimTask(next(self._seq), kind, kwargs, worker, int(pin.get("priority", 0)), deps)
        if self.keep_edge is not None:
            task.deps = tuple(d for d in deps if self.keep_edge(d, task))
        for d in task.deps:
            d.dependents.append(task)
        self._maybe_ready(task)
        self.queued[worker].append(task)
        self._fresh = True
        return task

    def done(self, handle: SimTask) -> bool:
        self._dispatch_fresh()
        return handle.done

    def results(self, handles: list[SimTask]) -> list[Any]:
        self._dispatch_fresh()
        missing = [h for h in handles if not h.done]
        if missing:
            raise RuntimeError(f"{len(missing)} task(s) asked for before they finished")
        return [h.result for h in handles]

    def idle(self, seconds: float) -> None:
        """The driver would sleep: advance the clock to the next completion instead."""
        self._dispatch_fresh()
        before = len(self.finished)
        while len(self.finished) == before:
            if not self._advance():
                waiting = sum(len(q) for q in self.queued.values())
                if waiting:
                    raise RuntimeError(f"deadlock: {waiting} task(s) wait on nothing that runs")
                return

    # ---- the event loop -----------------------------------------------------------------
    def _maybe_ready(self, task: SimTask) -> None:
        if task.ready_at is None and all(d.done for d in task.deps):
            last = max((d.end or 0.0 for d in task.deps), default=self.now)
            task.ready_at = max(last + self.dispatch_s, self.now)

    def _rate(self) -> float:
        n = len(self.running)
        return 1.0 if self.cores is None or n <= self.cores else self.cores / n

    def _dispatch_fresh(self) -> None:
        """Dispatch what was submitted since the clock last moved (nothing else can have
        become startable without the clock moving)."""
        if self._fresh:
            self._dispatch()

    def _dispatch(self) -> None:
        """Start the best ready task on every idle worker."""
        self._fresh = False
        for worker, queue in self.queued.items():
            if worker in self.running:
                continue
            ready = [t for t in queue if t.ready_at is not None and t.ready_at <= self.now + EPS]
            if not ready:
                continue
            task = max(ready, key=lambda t: (t.priority, -t.seq))
            queue.remove(task)
            task.start = self.now
            task.work = self.bodies.start(task.kind, task.kwargs, worker, self.now)
            task.remaining = task.work.seconds
            self.running[worker] = task

    def _next_time(self) -> float | None:
        rate = self._rate()
        times = [self.now + t.remaining / rate for t in self.running.values()]
        times += [
            t.ready_at
            for w, q in self.queued.items()
            if w not in self.running
            for t in q
            if t.ready_at is not None and t.ready_at > self.now
        ]
        return min(times, default=None)

    def _advance(self) -> bool:
        """Move to the next event (a completion or a task becoming ready); False if none."""
        t = self._next_time()
        if t is None:
            return False
        rate, dt = self._rate(), t - self.now
        self.now = t
        for worker, task in list(self.running.items()):
            task.remaining -= dt * rate
            if task.remaining <= EPS * max(1.0, t):
                self._complete(worker, task)
        self._dispatch()
        return True

    def _complete(self, worker: str, task: SimTask) -> None:
        del self.running[worker]
        task.end = self.now
        assert task.work is not None and task.start is not None
        w = task.work
        timing = Timing(
            w.phase or task.kind, w.agent, w.step, w.micro_batch, worker, task.start, task.end
        )
        task.result = w.make(timing)
        if w.active < 1.0:
            self.active[timing] = w.active
        self.finished.append(task)
        for d in task.dependents:
            self._maybe_ready(d)
