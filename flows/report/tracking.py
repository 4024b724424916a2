"""Experiment tracking: a run's per-step metrics, its config and its final models in the
trackers researchers already use (`run.tracking: [tensorboard, wandb]`).

The driver logs, never a worker: every metric is computed from the task results the
pipeline already collects (`step_metrics`, a pure function of one step's results), so
tracking costs no task time and no extra traffic. A step is logged once all of its
optimizer steps are in (its rollouts and scores are in by then: they come first).

- `tensorboard`: event files under `<run_dir>/tensorboard/` (`tensorboard --logdir RUN`),
  scalars named `agent/metric`, the resolved MEG and settings as text.
- `wandb`: an offline run under `<run_dir>/wandb/` (`wandb sync` uploads it later; nothing
  leaves the machine during the run), the settings as its config, final models as
  artifacts of type `model`.

Both packages are optional (`pip install -e ".[tracking]"`); naming a tracker whose package
is missing stops the run before anything starts, with the install command.
MLflow is not offered yet: its package does not install from this project's package index.
"""

from __future__ import annotations

import importlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from flows.orchestrator.futures import StepEnds
from flows.runs.record import RunError
from tasks.context import Timing
from tasks.refs import GenRef, RewardSum, ScoreRef, StepRef

ROLLOUT_PHASES, TRAIN_PHASES = ("generate", "score"), ("train_micro_batch", "optimizer_step")
STEP_METRICS = ("loss", "grad_norm", "ratio_mean", "clip_frac", "kl", "entropy_mc", "adv_abs_mean")


class Tracker(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_model(self, agent: str, path: Path) -> None: ...
    def close(self) -> None: ...


class TrackingError(RunError):
    """A tracker cannot start (its package is missing): the run stops before its cluster
    starts, reported as a user error."""


def _require(module: str, tracker: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(
            f"run.tracking names {tracker!r}, but {module!r} is not installed: "
            f'pip install -e ".[tracking]" (or drop {tracker!r} from run.tracking)'
        ) from None


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"run": {"mode": "flex"}} → {"run.mode": "flex"}; lists as JSON text."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list | tuple) else v
    return out


class TensorBoardTracker:
    def __init__(self, run_dir: Path, run_id: str, name: str) -> None:
        tb = _require("torch.utils.tensorboard", "tensorboard")
        self.writer = tb.SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log_params(self, params: dict[str, Any]) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(params, indent=2)}\n```", 0)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_model(self, agent: str, path: Path) -> None:
        self.writer.add_text(f"final/{agent}", str(path), 0)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, run_id: str, name: str) -> None:
        self.wandb = _require("wandb", "wandb")
        self.run = self.wandb.init(
            mode="offline",
            dir=str(run_dir),
            project=name,
            id=run_id.replace("/", "-"),
            resume="allow",  # a resumed run goes on in the same wandb run
            settings=self.wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(flatten(params), allow_val_change=True)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_model(self, agent: str, path: Path) -> None:
        art = self.wandb.Artifact(f"{agent}-final", type="model")
        art.add_dir(str(path))
        self.run.log_artifact(art)

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, type] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker}


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
    try:
        for n in names:
            opened.append(TRACKERS[n](run_dir, run_id, name))
        t = Tracking(opened, agents, (1, 1))
        if opened:  # no tracker: the pipeline computes no tracked metrics at all
            _ACTIVE[run_id] = t
        if params is not None:
            t.log_params(params)
        yield t
    finally:
        _ACTIVE.pop(run_id, None)
        for tr in opened:
            tr.close()


def active(run_id: str) -> Tracking | None:
    return _ACTIVE.get(run_id)


def fan_out(*handlers: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """One pipeline event handler that calls each of `handlers` in turn."""

    def handle(kind: str, ref: Any) -> None:
        for h in handlers:
            h(kind, ref)

    return handle
