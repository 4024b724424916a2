"""The breakdown's attribution: per-task phase CPU times and per-process CPU → categories a
step (pure functions), and the phase timers' exclusive accounting."""

from __future__ import annotations

import time
import types

import pytest

from bench.breakdown import (
    CATEGORIES,
    ORDER,
    _Phases,
    attribute,
    summarize,
    thread_source,
    window_cpu,
)


def test_phases_and_processes_become_categories_a_step() -> None:
    records = [
        # inside the window [10, 20]: counted
        {"start": 11.0, "pid": 1, "cpu": {"task": 0.1, "sampling": 0.5, "store_commit": 0.04}},
        {"start": 12.0, "pid": 2, "cpu": {"task": 0.05, "forward_backward": 0.3, "slots": 0.02}},
        {"start": 13.0, "pid": 1, "cpu": {"tokenize": 0.02, "store_read": 0.03, "reward": 0.01}},
        # step 0, before the window: left out
        {"start": 5.0, "pid": 1, "cpu": {"sampling": 9.0}},
    ]
    processes = {
        "worker:rollout-0": 0.9,  # 0.7 in its tasks: 0.2 Dask
        "worker:train-0": 0.45,  # 0.37 in its tasks: 0.08 Dask
        "reward_processes": 0.04,
        "prefect_server": 0.1,
        "driver_prefect": 0.02,
        "driver_dask": 0.06,
        "driver_main": 0.08,
        "bench": 5.0,  # the benchmark's own sampler: not the run's
        "unattributed": 0.01,
    }
    got = attribute(records, processes, 10.0, 20.0, steps=2)
    assert list(got) == list(ORDER)
    want = {
        "model: sampling": 0.5,
        "model: forward/backward": 0.3,
        "tokenization": 0.02,
        "store reads": 0.03,
        "store commits": 0.04,
        "reward scoring": 0.05,
        "training slots (acquire, swap)": 0.02,
        "task glue (Python in tasks)": 0.15,
        "Dask (workers' event loops, transfers)": 0.28,
        "Dask (scheduler + client)": 0.06,
        "Prefect (server + client)": 0.12,
        "driver main thread (orchestrator, flow engine)": 0.08,
        "other / unattributed": 0.01,
    }
    for cat in ORDER:
        assert got[cat] == pytest.approx(want.get(cat, 0.0) / 2, abs=1e-4), cat
    # every core-second of the run's processes is in exactly one category
    run_total = sum(v for k, v in processes.items() if k != "bench")
    assert sum(got.values()) * 2 == pytest.approx(run_total, abs=1e-3)


def test_a_worker_never_spends_less_than_nothing_outside_its_tasks() -> None:
    records = [{"start": 1.0, "pid": 1, "cpu": {"sampling": 1.0}}]
    got = attribute(records, {"worker:rollout-0": 0.9}, 0.0, 2.0, steps=1)
    assert got[CATEGORIES["worker_outside_tasks"]] == 0.0


def test_summary_is_the_median_with_the_range_and_shares() -> None:
    reps = [{"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 0.0}, {"a": 3.0, "b": 1.0}]
    s = summarize(reps)
    assert s["a"] == {"median": 2.0, "min": 1.0, "max": 3.0, "share": 1.0}
    assert s["total"] == {"median": 2.0, "min": 2.0, "max": 4.0}
    assert s["b"]["share"] == 0.5


def test_a_window_counts_each_thread_or_process_from_its_first_sample_inside() -> None:
    samples = [
        (0.0, {("driver_main", 1): 1.0}),
        (1.0, {("driver_main", 1): 2.0, ("worker:rollout-0", 7): 10.0}),
        (
            2.0,
            {("driver_main", 1): 2.5, ("worker:rollout-0", 7): 11.0, ("reward_processes", 9): 0.3},
        ),
        (3.0, {("driver_main", 1): 3.0}),  # the worker's last sample came before: kept
        (9.0, {("driver_main", 1): 100.0}),  # outside
    ]
    got = window_cpu(samples, 1.0, 3.0)
    assert got == pytest.approx(
        {"driver_main": 1.0, "worker:rollout-0": 1.0, "reward_processes": 0.3}
    )
    assert window_cpu(samples, 8.5, 9.5) == {}  # one sample: no interval


def test_driver_threads_are_told_apart_by_name() -> None:
    assert thread_source("MainThread") == "driver_main"
    assert thread_source("IO loop") == "driver_dask"
    assert thread_source("APILogWorkerThread") == "driver_prefect"
    assert thread_source("breakdown-sampler") == "bench"
    assert thread_source("Thread-7") == "unattributed"


def test_timers_count_each_phase_exclusive_of_the_phases_inside() -> None:
    timers = _Phases()

    def burn(seconds: float) -> None:
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            pass

    inner = timers.timed("sampling", lambda: burn(0.05))

    def body(kind: str, step: int) -> str:
        burn(0.02)
        inner()
        return kind

    task = timers.timed("task", body)
    assert task("generate", step=3) == "generate"  # the wrapped function's result
    (rec,) = timers.records
    assert rec["kind"] == "generate" and rec["step"] == 3
    assert rec["cpu"]["sampling"] == pytest.approx(0.05, abs=0.02)
    assert rec["cpu"]["task"] == pytest.approx(0.02, abs=0.015)  # its own time only
    assert rec["end"] >= rec["start"]


def test_install_wraps_functions_and_methods_once() -> None:
    from bench import breakdown

    mod = types.ModuleType("fake_mod_for_breakdown")

    class Thing:
        def read(self) -> int:
            return 4

    def f(x: int) -> int:
        return x + 1

    mod.f = f  # type: ignore[attr-defined]
    mod.Thing = Thing  # type: ignore[attr-defined]
    import sys

    sys.modules["fake_mod_for_breakdown"] = mod
    try:
        phases = (
            ("fake_mod_for_breakdown", "f", "task"),
            ("fake_mod_for_breakdown", "Thing.read", "store_read"),
        )
        breakdown.install(phases)
        wrapped = mod.f
        breakdown.install(phases)  # again: no second wrapper
        assert mod.f is wrapped
        assert mod.f(1) == 2 and Thing().read() == 4
        assert hasattr(Thing.__dict__["read"], "__wrapped_phase__")
    finally:
        del sys.modules["fake_mod_for_breakdown"]
        breakdown.take_records()
