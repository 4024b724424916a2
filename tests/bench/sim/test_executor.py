"""The discrete-event executor on hand-made graphs: dependencies, one task per worker,
priorities, the clock, shared cores, edge filters (no pipeline, no wall clock)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.sim.executor import SimExecutor, SimTask, Work, handles_in


class Fixed:
    """Bodies: every task takes kwargs["d"] seconds and returns its own timing."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, float]] = []

    def start(self, kind: str, kwargs: dict[str, Any], worker: str, now: float) -> Work:
        self.started.append((kwargs["name"], worker, now))
        return Work(kwargs["d"], lambda t: t, kind)


def pin(worker: str, priority: int = 0) -> dict[str, Any]:
    return {"resources": {worker: 1.0}, "priority": priority}


def drain(ex: SimExecutor, handles: list[SimTask]) -> None:
    while not all(ex.done(h) for h in handles):
        ex.idle(0.05)


def test_dependencies_wait_for_their_inputs_plus_dispatch() -> None:
    ex = SimExecutor(Fixed(), ("a", "b"), dispatch_s=0.5)
    first = ex.submit("generate", {"name": "x", "d": 2.0}, pin("a"))
    second = ex.submit("train", {"name": "y", "d": 1.0, "after": (first,)}, pin("b"))
    drain(ex, [first, second])
    assert (first.start, first.end) == (0.5, 2.5)  # submitted at 0, ready after dispatch
    assert second.start == pytest.approx(3.0) and second.end == pytest.approx(4.0)
    assert second.result.worker == "b" and second.result.start == pytest.approx(3.0)


def test_one_task_at_a_time_per_worker_and_parallel_across_workers() -> None:
    ex = SimExecutor(Fixed(), ("a", "b"))
    hs = [
        ex.submit("score", {"name": n, "d": 1.0}, pin(w))
        for n, w in (("1", "a"), ("2", "a"), ("3", "b"))
    ]
    drain(ex, hs)
    assert [h.end for h in hs] == [1.0, 2.0, 1.0]


def test_highest_priority_first_then_submission_order() -> None:
    bodies = Fixed()
    ex = SimExecutor(bodies, ("a",))
    hs = [
        ex.submit("score", {"name": n, "d": 1.0}, pin("a", p))
        for n, p in (("low", -5), ("high", 3), ("tie-1", 0), ("tie-2", 0))
    ]
    drain(ex, hs)
    assert [name for name, _, _ in bodies.started] == ["high", "tie-1", "tie-2", "low"]


def test_a_worker_starts_what_it_holds_before_what_a_finish_makes_ready() -> None:
    """The race of flows.orchestrator.pipeline: a task made ready by a finish reaches the worker one
    dispatch later, so the worker first starts a lower-priority task it already holds."""
    bodies = Fixed()
    ex = SimExecutor(bodies, ("a",), dispatch_s=0.1)
    first = ex.submit("generate", {"name": "first", "d": 1.0}, pin("a", 10))
    waiting = ex.submit("score", {"name": "child", "d": 1.0, "after": (first,)}, pin("a", 5))
    held = ex.submit("generate", {"name": "held", "d": 1.0}, pin("a", 0))
    drain(ex, [first, waiting, held])
    assert [name for name, _, _ in bodies.started] == ["first", "held", "child"]


def test_idle_advances_the_clock_to_the_next_completion() -> None:
    ex = SimExecutor(Fixed(), ("a", "b"))
    short = ex.submit("step", {"name": "s", "d": 1.5}, pin("a"))
    long = ex.submit("step", {"name": "l", "d": 4.0}, pin("b"))
    assert not ex.done(short) and ex.now == 0.0
    ex.idle(0.05)
    assert ex.now == 1.5 and ex.done(short) and not ex.done(long)
    ex.idle(0.05)
    assert ex.now == 4.0 and ex.results([short, long])[1].end == 4.0


def test_shared_cores_slow_every_running_task() -> None:
    ex = SimExecutor(Fixed(), ("a", "b", "c"), cores=2)
    hs = [ex.submit("train", {"name": w, "d": 2.0}, pin(w)) for w in ("a", "b", "c")]
    drain(ex, hs)
    assert [h.end for h in hs] == pytest.approx([3.0, 3.0, 3.0])  # 3 tasks on 2 cores


def test_handles_are_found_nested_and_values_are_not_dependencies() -> None:
    ex = SimExecutor(Fixed(), ("a",))
    a = ex.submit("step", {"name": "a", "d": 1.0}, pin("a"))
    b = ex.submit("step", {"name": "b", "d": 1.0}, pin("a"))
    kwargs = {"after": (a, "value", (b,)), "weights": {"w": a}, "trains": [1, 2]}
    assert list(dict.fromkeys(handles_in(kwargs))) == [a, b]


def test_edge_filter_drops_an_edge_and_a_worker_pin_by_address_works() -> None:
    ex = SimExecutor(Fixed(), ("tcp://x",), keep_edge=lambda dep, task: False)
    first = ex.submit("generate", {"name": "f", "d": 1.0}, {"workers": ["tcp://x"], "priority": 0})
    second = ex.submit(
        "generate",
        {"name": "s", "d": 1.0, "after": (first,)},
        {"workers": ["tcp://x"], "priority": 9},
    )
    drain(ex, [first, second])
    assert second.start == 0.0  # no edge left: the higher priority starts first


def test_unknown_worker_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown worker"):
        SimExecutor(Fixed(), ("a",)).submit("score", {"name": "x", "d": 1.0}, pin("zz"))
