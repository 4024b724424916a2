"""The progress artifact's throttle: at most one update a second, the last step always.

`prefect.artifacts.update_progress_artifact` is replaced by a recorder here (what the
throttle decides is ours; that a real run leaves the artifact at 100 % on a real Prefect
server is `tests/flows/test_train.py::test_runs_publish_prefect_artifacts`)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from flows.report.progress import ARTIFACT_EVERY_S, Progress
from tasks.context import Timing
from tasks.refs import StepRef


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step(agent: str, k: int) -> StepRef:
    timing = Timing("optimizer_step", agent, k, -1, "train-0", 0.0, 0.0)
    return StepRef(agent, k, k + 1, False, 0.0, 0.0, False, timing)


@pytest.fixture
def updates(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The progress values the artifact was updated to, in order (a recorder)."""
    seen: list[float] = []

    def record(artifact_id: Any, progress: float) -> None:
        assert artifact_id == "artifact-id"
        seen.append(progress)

    monkeypatch.setattr("prefect.artifacts.update_progress_artifact", record)
    return seen


def progress(agents: list[str], steps: int, clock: Clock) -> Progress:
    p = Progress(agents, steps, console=Console(file=io.StringIO()), clock=clock)
    p._artifact = "artifact-id"  # as __enter__ sets it inside a flow run
    return p


@pytest.mark.parametrize(
    ("steps", "every_s", "expected"),
    [
        (10, 0.3, [10.0, 50.0, 90.0, 100.0]),  # the first, then one a second, the last
        (4, 2.0, [25.0, 50.0, 75.0, 100.0]),  # slow steps: every step
    ],
)
def test_the_artifact_is_updated_at_most_once_a_second_and_at_the_last_step(
    updates: list[float], steps: int, every_s: float, expected: list[float]
) -> None:
    assert ARTIFACT_EVERY_S == 1.0  # the spacing the expected values assume
    clock = Clock()
    p = progress(["a"], steps, clock)
    for k in range(steps):
        clock.now = every_s * k
        p("optimizer_step", step("a", k))
    assert updates == expected


def test_a_run_that_stops_early_reports_its_last_finished_step(updates: list[float]) -> None:
    clock = Clock()
    p = progress(["a"], 10, clock)
    for k in range(3):
        clock.now = 0.1 * k
        p("optimizer_step", step("a", k))
    assert updates == [10.0]  # the first step; the next two fell within the second
    p.__exit__(RuntimeError, RuntimeError("worker died"), None)  # the flow leaves its `with`
    assert updates == [10.0, 30.0]


def test_a_failing_final_update_does_not_hide_the_runs_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def server_gone(artifact_id: Any, progress: float) -> None:
        raise ConnectionError("the Prefect server is gone")

    clock = Clock()
    p = progress(["a"], 10, clock)
    p._reported = (0.0, 0)  # an update happened, then steps finished within the second
    p.steps_done = 2
    monkeypatch.setattr("prefect.artifacts.update_progress_artifact", server_gone)
    p.__exit__(RuntimeError, RuntimeError("worker died"), None)  # raises nothing of its own


def test_several_agents_update_only_when_all_finished_the_same_steps(
    updates: list[float],
) -> None:
    clock = Clock()
    p = progress(["a", "b"], 2, clock)
    p("optimizer_step", step("a", 0))
    assert updates == []  # b has not finished step 0
    p("optimizer_step", step("b", 0))
    clock.now = 0.5
    p("optimizer_step", step("a", 1))
    p("optimizer_step", step("b", 1))  # the last step: reported though < 1 s passed
    assert updates == [50.0, 100.0]
