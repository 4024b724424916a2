"""The calibration fit on synthetic timelines: known constants come back."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim.fit import effective_cores, nnls, worker_gaps


def test_nnls_recovers_nonnegative_coefficients_and_drops_negative_ones() -> None:
    x = np.column_stack([np.ones(20), np.arange(20.0), np.arange(20.0) ** 0.5])
    y = 0.25 + 0.01 * np.arange(20.0)
    assert nnls(x, y) == pytest.approx([0.25, 0.01, 0.0], abs=1e-9)
    assert (nnls(x, -y) >= 0).all()


def task(
    worker: str, start: float, end: float, phase: str = "train", agent: str = "a"
) -> dict[str, object]:
    return {"worker": worker, "start": start, "end": end, "phase": phase, "agent": agent, "step": 1}


def test_worker_gaps_are_the_short_idle_gaps_of_one_worker() -> None:
    tasks = [task("w", 0, 1), task("w", 1.004, 2), task("w", 5, 6), task("v", 0, 1.5)]
    assert worker_gaps(tasks) == pytest.approx([0.004])


def test_effective_cores_from_tasks_slowed_by_their_neighbours() -> None:
    """Alone a task takes 1 s; four side by side take 2 s each: they shared 2 cores."""
    base = [[task("w", 0, 1)]]
    shared = [[task(f"w{i}", 0, 2) for i in range(4)]]
    assert effective_cores(base, shared) == pytest.approx(2.0)
