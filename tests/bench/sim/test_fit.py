"""The calibration fit on synthetic timelines: known constants come back."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim.fit import best_cores, effective_cores, nnls, worker_gaps


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


def test_best_cores_minimises_the_squared_relative_errors() -> None:
    """Two arms whose predictions scale as 1/cores against measurements made at 1.7 and
    1.5 cores: the fit lands between them, nearer the arm that pulls harder."""

    def errors_at(cores: float) -> list[float]:
        return [1.7 / cores - 1, 1.5 / cores - 1]

    grid = [round(1 + 0.02 * i, 2) for i in range(51)]
    best = best_cores(errors_at, grid)
    assert 1.5 < best < 1.7 and best in grid
    assert sum(e * e for e in errors_at(best)) <= min(
        sum(e * e for e in errors_at(c)) for c in grid
    )
    assert best_cores(lambda c: [c - 1.3], grid) == pytest.approx(1.3)
