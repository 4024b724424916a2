"""Experiment tracking: a run's per-step metrics, its config and its final models in the
trackers researchers already use (`run.tracking: [tensorboard, wandb, mlflow]`; the
trackers themselves are in `flows.report.trackers`).

The driver logs, never a worker: every metric is computed from the task results the
pipeline already collects (`step_metrics`, a pure function of one step's results), so
tracking costs no task time and no extra traffic. A step is logged once all of its
optimizer steps are in (its rollouts and scores are in by then: they come first).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.orchestrator.futures import StepEnds
from flows.report.trackers import TRACKERS, Tracker
from tasks.context import Timing
from tasks.refs import GenRef, RewardSum, ScoreRef, StepRef

ROLLOUT_PHASES, TRAIN_PHASES = ("generate", "score"), ("train_micro_batch", "optimizer_step")
STEP_METRICS = ("loss", "grad_norm", "ratio_mean", "clip_frac", "kl", "entropy_mc", "adv_abs_mean")


def _idle(ts: list[Timing], phases: tuple[str, ...], interval: float, workers: int) -> float:
    """1 − the step's seconds of `phases` over (interval × the role's workers), in [0, 1]."""
    busy = sum(t.seconds for t in ts if t.phase in phases)
    return min(1.0, max(0.0, 1 - busy / (interval * workers))) if interval > 0 else 0.0


def step_metrics(
    step: int, refs: list[Any], interval: float, roles: tuple[int, int]
) -> dict[str, float]:
    """The tracked metrics of one step from its task results (pure). `interval`: seconds
    since the previous step completed; `roles`: (rollout workers, training workers)."""
    out: dict[str, float] = {"step/wall_s": interval}
    tokens: dict[str, list[float]] = defaultdict(list)
    seconds: dict[str, float] = defaultdict(float)
    lag: dict[str, int] = defaultdict(int)
    rewards: dict[str, RewardSum] = defaultdict(RewardSum)
    team = RewardSum()
    for r in refs:
        if isinstance(r, GenRef):
            tokens[r.agent].append(r.decode_tokens)
            seconds[r.agent] += r.timing.seconds
            if r.versions:
                lag[r.agent] = max(lag[r.agent], step - min(r.versions))
        elif isinstance(r, ScoreRef):
            team += r.team
            for agent, reward in r.agent_reward.items():
                rewards[agent] += reward
            for agent, n in r.failed.items():
                out[f"{agent}/failed_rewards"] = out.get(f"{agent}/failed_rewards", 0) + n
        elif isinstance(r, StepRef):
            values = {"loss": r.loss, "grad_norm": r.grad_norm, **r.metrics}
            out.update({f"{r.agent}/{k}": v for k, v in values.items() if k in STEP_METRICS})
    for agent, toks in tokens.items():
        if seconds[agent] > 0:
            out[f"{agent}/tokens_per_s"] = sum(toks) / seconds[agent]
        out[f"{agent}/staleness"] = lag[agent]
    out.update({f"{a}/reward": v.mean for a, v in rewards.items() if v.mean is not None})
    if team.mean is not None:
        out["team/reward"] = team.mean
    ts = [r.timing for r in refs if getattr(r, "timing", None) is not None]
    out["step/rollout_idle"] = _idle(ts, ROLLOUT_PHASES, interval, roles[0])
    out["step/trainer_idle"] = _idle(ts, TRAIN_PHASES, interval, roles[1])
    return out


class Tracking:
    """The run's trackers, fed one step at a time by the pipeline's events."""

    def __init__(self, trackers: list[Tracker], agents: int, roles: tuple[int, int]) -> None:
        self.trackers, self.agents, self.roles = trackers, agents, roles
        self._refs: dict[int, list[Any]] = defaultdict(list)
        self._ends = StepEnds(agents)
        self.last_end = 0.0  # set by the pipeline when it starts (`start`)

    def start(self, t0: float) -> None:
        self.last_end = t0

    def __call__(self, kind: str, ref: Any) -> None:
        k = ref.step
        self._refs[k].append(ref)
        if not isinstance(ref, StepRef):
            return
        end = self._ends.stepped(k, ref.timing.end)
        if end is not None:
            interval = max(0.0, end - self.last_end)
            self.last_end = max(self.last_end, end)
            metrics = step_metrics(k, self._refs.pop(k), interval, self.roles)
            for t in self.trackers:
                t.log_metrics(k, metrics)

    def log_params(self, params: dict[str, Any]) -> None:
        for t in self.trackers:
            t.log_params(params)

    def log_models(self, final: Path) -> None:
        for path in sorted(final.iterdir()) if final.is_dir() else []:
            for t in self.trackers:
                t.log_model(path.name, path)


_ACTIVE: dict[str, Tracking] = {}  # run id → its tracking, in the driver process


@contextmanager
def tracking(
    names: tuple[str, ...],
    run_dir: Path,
    run_id: str,
    name: str,
    agents: int,
    params: dict[str, Any] | None = None,
) -> Iterator[Tracking]:
    """Open the named trackers for a run and log its `params` (closed on the way out, also
    on failure); the pipeline finds them by run id (`active`). Set `roles` once the cluster
    is known."""
    opened: list[Tracker] = []
    ok = False
    try:
        for n in names:
            opened.append(TRACKERS[n](run_dir, run_id, name))
        t = Tracking(opened, agents, (1, 1))
        if opened:  # no tracker: the pipeline computes no tracked metrics at all
            _ACTIVE[run_id] = t
        if params is not None:
            t.log_params(params)
        yield t
        ok = True
    finally:
        _ACTIVE.pop(run_id, None)
        for tr in opened:
            tr.close(ok)  # a run that raised is marked failed where the tracker can say so


def active(run_id: str) -> Tracking | None:
    return _ACTIVE.get(run_id)


def fan_out(*handlers: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """One pipeline event handler that calls each of `handlers` in turn."""

    def handle(kind: str, ref: Any) -> None:
        for h in handlers:
            h(kind, ref)

    return handle
