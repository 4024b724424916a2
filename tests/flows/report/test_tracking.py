"""Tracked metrics from one step's task results (pure), the tracker registry's errors, and
TensorBoard event files read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows.report import trackers, tracking
from flows.report.trackers import TrackingError, flatten
from flows.report.tracking import Tracking, step_metrics
from storage.table import SegmentRef
from tasks.context import Timing
from tasks.refs import GenRef, RewardSum, ScoreRef, StepRef


def timing(phase: str, agent: str, start: float, end: float, step: int = 3) -> Timing:
    return Timing(phase, agent, step, 0, "w", start, end)


def gen(agent: str, tokens: int, seconds: float, versions: tuple[int, ...]) -> GenRef:
    seg = SegmentRef("memory://x", "r", agent, "s", "rows", 4, versions, 0)
    return GenRef(
        "n", agent, 3, 0, seg, 4, tokens, versions, False, timing("generate", agent, 0, seconds)
    )


def score(rewards: dict[str, RewardSum], team: RewardSum, failed: dict[str, int]) -> ScoreRef:
    return ScoreRef(3, 0, ("n",), 4, rewards, team, timing("score", "-", 1, 1.5), failed)


def step(agent: str, end: float, **metrics: float) -> StepRef:
    t = timing("optimizer_step", agent, end - 1, end)
    return StepRef(agent, 3, 4, False, 0.5, 2.0, False, t, 0.0, metrics)


REFS: list[Any] = [
    gen("solver", 60, 2.0, (3,)),
    gen("solver", 40, 2.0, (2, 3)),
    gen("verifier", 10, 1.0, (3,)),
    score({"solver": RewardSum(1.0, 4)}, RewardSum(1.0, 4), {}),
    score(
        {"solver": RewardSum(3.0, 4), "verifier": RewardSum(2.0, 2)},
        RewardSum(3.0, 4),
        {"verifier": 1},
    ),
    step("solver", 9.0, clip_frac=0.25, entropy_mc=1.5, unknown=7.0),
    step("verifier", 10.0, kl=0.01),
]


def test_step_metrics_per_agent() -> None:
    m = step_metrics(3, REFS, interval=10.0, roles=(1, 1))
    assert m["solver/reward"] == pytest.approx(0.5)  # 4 of 8 samples, over both groups
    assert m["verifier/reward"] == pytest.approx(1.0)
    assert m["team/reward"] == pytest.approx(0.5)
    assert m["solver/tokens_per_s"] == pytest.approx(25.0)  # 100 tokens in 4 s
    assert m["solver/staleness"] == 1 and m["verifier/staleness"] == 0
    assert m["verifier/failed_rewards"] == 1
    assert m["solver/loss"] == 0.5 and m["solver/grad_norm"] == 2.0
    assert m["solver/clip_frac"] == 0.25 and m["solver/entropy_mc"] == 1.5
    assert m["verifier/kl"] == 0.01
    assert "solver/unknown" not in m  # only the documented diagnostics
    # rollout: 5 s generating + 1 s scoring of 10; training: 2 s of optimizer steps of 10
    assert m["step/rollout_idle"] == pytest.approx(0.4)
    assert m["step/trainer_idle"] == pytest.approx(0.8)
    assert m["step/wall_s"] == 10.0


class Recorder:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.logged.append((step, metrics))


def test_a_step_is_logged_once_every_agent_stepped() -> None:
    rec = Recorder()
    t = Tracking([rec], agents=2, roles=(1, 1))  # type: ignore[list-item]
    t.start(0.0)
    for ref in REFS[:-1]:
        t("event", ref)
    assert rec.logged == []  # the verifier has not stepped yet
    t("optimizer_step", REFS[-1])
    assert [s for s, _ in rec.logged] == [3]
    assert rec.logged[0][1]["step/wall_s"] == 10.0  # from the start to its last step


def test_a_missing_tracker_package_stops_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def missing(name: str) -> Any:
        raise ImportError(name)

    monkeypatch.setattr(trackers.importlib, "import_module", missing)
    opened = tracking.tracking(("wandb",), tmp_path, "run-1", "demo", 2)
    with pytest.raises(TrackingError, match=r'pip install -e "\.\[tracking\]"'), opened:
        pass


def test_flatten_names_nested_settings() -> None:
    assert flatten({"run": {"mode": "flex", "tracking": ["wandb"]}, "name": "x"}) == {
        "run.mode": "flex",
        "run.tracking": '["wandb"]',
        "name": "x",
    }


def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    params = {"run": {"mode": "flex"}}
    with tracking.tracking(("tensorboard",), tmp_path, "run-1", "demo", 2, params) as t:
        t.start(0.0)
        for ref in REFS:
            t("event", ref)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "solver/reward" in scalars and "team/reward" in scalars
    [point] = events.Scalars("solver/tokens_per_s")
    assert point.step == 3 and point.value == pytest.approx(25.0)
    assert "config/text_summary" in events.Tags()["tensors"]


def test_only_a_run_with_trackers_is_active(tmp_path: Path) -> None:
    with tracking.tracking((), tmp_path, "run-0", "demo", 2) as t:
        assert tracking.active("run-0") is None and t.trackers == []
    with tracking.tracking(("tensorboard",), tmp_path, "run-1", "demo", 2) as t:
        assert tracking.active("run-1") is t
    assert tracking.active("run-1") is None  # closed with the run
