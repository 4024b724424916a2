"""The handles of the steps in flight, by task kind, and what the driver learned of them.

A handle is what the executor returned for a submitted task (a Dask or Prefect future). Once
its result is in, the pipeline passes later tasks the result (`resolved`) instead of the
handle, which ends the task's lineage there; `forget_before` drops the handles of steps no
task will need again. Both keep the scheduler's memory flat over a long run (bench/soak.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# Task kind → position of the step in its key: generate (node, k, j), score (k, j, group),
# train_micro_batch (agent, k, j), optimizer_step (agent, k), hand_over (agent, k).
STEP_AT = {
    "generate": 1,
    "score": 0,
    "train_micro_batch": 1,
    "optimizer_step": 1,
    "hand_over": 1,
}


def _drop_before(table: dict[Any, Any], at: int, k: int) -> list[Any]:
    """Remove the entries whose step (`key[at]`) is < k; return their values."""
    return [table.pop(key) for key in [key for key in table if key[at] < k]]


class Futures:
    """`futures[kind][key]` → handle, for the steps in flight."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple[Any, ...], Any]] = {kind: {} for kind in STEP_AT}
        self.generate_worker: dict[tuple[str, int, int], str] = {}  # where each generate runs
        self._refs: dict[int, tuple[Any, Any]] = {}  # id(handle) -> (handle, its result)
        self._forgotten = 0  # steps below this one have no handles any more

    def __getitem__(self, kind: str) -> dict[tuple[Any, ...], Any]:
        return self.tables[kind]

    def finished(self, handle: Any, ref: Any) -> None:
        if ref.step >= self._forgotten:
            self._refs[id(handle)] = (handle, ref)

    def resolved(self, handle: Any) -> Any:
        """A finished task's result, else its handle: a value ends the lineage there."""
        held, ref = self._refs.get(id(handle), (None, None))
        return ref if held is handle and handle is not None else handle

    def forget_before(self, k: int) -> None:
        """Drop the handles of steps < k (a running task stays held by the pipeline's
        pending list). Held, each kept its task's result and arguments alive on the scheduler
        and the workers for the whole run (bench/soak.py)."""
        self._forgotten = max(self._forgotten, k)
        for kind, at in STEP_AT.items():
            for handle in _drop_before(self.tables[kind], at, k):
                self._refs.pop(id(handle), None)
        _drop_before(self.generate_worker, 1, k)

    def handles_of(self, k: int) -> list[Any]:
        """Every submitted handle of step k, of every kind."""
        return [
            h
            for kind, at in STEP_AT.items()
            for key, h in self.tables[kind].items()
            if key[at] == k
        ]

    def all(self) -> list[Any]:
        return [h for table in self.tables.values() for h in table.values()]


class StepEnds:
    """When each step completes: the end of the last of its agents' optimizer steps (what
    the training allocation and the trackers both wait for)."""

    def __init__(self, agents: int) -> None:
        self.agents = agents
        self._left: dict[int, int] = {}
        self._end: dict[int, float] = {}

    def stepped(self, step: int, end: float) -> float | None:
        """One agent's optimizer step of `step` ended at `end`; the step's end if it was
        the last one, else None."""
        self._left[step] = self._left.get(step, self.agents) - 1
        self._end[step] = max(self._end.get(step, end), end)
        if self._left[step]:
            return None
        del self._left[step]
        return self._end.pop(step)


class StepLog:
    """The results of one step's tasks, as the pipeline collects them.

    The per-step Prefect task (`flows.orchestrator.step_tasks`) waits on this instead of fetching
    the step's results a second time: every result crosses the network once, into the driver."""

    def __init__(self, step: int, expected: int) -> None:
        self.step, self.expected = step, expected
        self.refs: list[Any] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def add(self, ref: Any) -> None:
        self.refs.append(ref)
        if len(self.refs) >= self.expected:
            self._done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.set()

    def wait(self) -> list[Any]:
        self._done.wait()
        if self.error is not None:
            raise RuntimeError(f"step {self.step} failed: {self.error}") from self.error
        return list(self.refs)


class WatchUnit:
    """Consecutive steps that one Prefect task run watches (`flows.orchestrator.step_tasks`).

    A task run costs the driver and the Prefect server CPU whatever it covers (its events,
    its states; measured ~20 ms a run on 2 cores, 8% of a 0.25 s step). So a unit takes the
    steps the driver submits within `seconds` of its first: steps that come a second or
    more apart get a task run each, as before; a tiny job's 0.25 s steps share one, four at
    a time. The driver `add`s each step's log; False means the unit is past its time (it
    closes then) and the step opens a new unit. The watcher takes the logs in order
    (`next`) until the unit is closed and empty; the driver closes the last unit at the end
    of the run."""

    def __init__(
        self,
        step: int,
        log: StepLog,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first, self.seconds, self._clock = step, seconds, clock
        self._opened = clock()
        self._logs = [log]
        self._closed = False
        self._cond = threading.Condition()

    def add(self, log: StepLog) -> bool:
        with self._cond:
            if not self._closed and self._clock() - self._opened >= self.seconds:
                self._closed = True
                self._cond.notify_all()
            if self._closed:
                return False
            self._logs.append(log)
            self._cond.notify_all()
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def next(self) -> StepLog | None:
        """The next step's log, in submission order; None once the unit is closed and
        every log added before was taken."""
        with self._cond:
            while not self._logs and not self._closed:
                self._cond.wait()
            return self._logs.pop(0) if self._logs else None
