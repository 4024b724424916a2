"""One simulated run: the real `Pipeline` over a `SimExecutor`, and its step-time metrics.

The loop is `flows.train.run_pipeline`'s (wait for the window, submit a step's rollout and
training, finish), without its live progress display and Prefect artifact, which need a
Prefect API. `step_s` has `bench.e2e.steady_state`'s definition: the median interval between
the completions of consecutive steps, over steps ≥ 1 (step 0 of a real run loads models).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.sim.bodies import SimBodies
from bench.sim.costs import Costs
from bench.sim.executor import SimExecutor, SimTask
from bench.sim.lengths import Lengths
from flows.cluster.start import Workers
from flows.orchestrator.pipeline import Pipeline
from flows.report.metrics import per_step, timings
from meg import MEGSpec
from tasks.context import RunContext, Timing


@dataclass(frozen=True, slots=True)
class Layout:
    """Workers by role and the accelerators of each (a colocated worker is in both roles)."""

    rollout: tuple[str, ...]
    train: tuple[str, ...]
    accel: Mapping[str, int]
    train_slots: int = 2

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.rollout, *self.train)))

    @property
    def total_accel(self) -> int:
        return sum(self.accel[w] for w in self.workers)

    def pins(self) -> Workers:
        """The `Workers` the pipeline pins with (as a local cluster's: by own resource)."""
        return Workers(
            "sim://", self.rollout, self.train, {w: {"resources": {w: 1.0}} for w in self.workers}
        )


@dataclass(frozen=True, slots=True)
class Arm:
    """How one arm runs the graph: mode, η, balancing, elastic training allocation."""

    mode: str
    staleness: int = 0
    balance: bool = True
    elastic: bool = False  # elastic training allocation (engines.training.allocation)


@dataclass(frozen=True, slots=True)
class SimRun:
    step_s: float  # median completion interval, steps ≥ 1 (bench.e2e's definition)
    mean_step_s: float  # (end of the last step − end of step 0) / (steps − 1)
    utilization: float  # busy accelerator-seconds / (accelerators × window), steps ≥ 1
    wall_s: float
    timings: tuple[Timing, ...]
    per_step: tuple[dict[str, Any], ...]
    counts: dict[str, int] = field(default_factory=dict)  # swaps, loads, role switches, tasks


def steady_state(
    ts: list[Timing],
    rows: list[dict[str, Any]],
    accel: Mapping[str, int],
    active: Mapping[Timing, float] | None = None,
) -> tuple[float, float]:
    """(step_s, utilization) over steps ≥ 1: the window from the end of step 0 to the end of
    the run, each task clipped to it and weighted by the accelerators of its worker it kept
    computing (`active`, a share; 1 for a task not in it) — the paper's utilization, the
    accelerators' active time, not MFU."""
    share = active or {}
    later = [r["wall_s"] for r in rows if r["step"] >= 1] or [r["wall_s"] for r in rows]
    begin = max((t.end for t in ts if t.phase == "optimizer_step" and t.step == 0), default=0.0)
    end = max(t.end for t in ts)
    busy = sum(
        max(0.0, min(t.end, end) - max(t.start, begin)) * accel[t.worker] * share.get(t, 1.0)
        for t in ts
    )
    total = (end - begin) * sum(accel.values())
    return statistics.median(later), busy / total if total > 0 else 0.0


def simulate(
    spec: MEGSpec,
    arm: Arm,
    layout: Layout,
    costs: Costs,
    lengths: Mapping[str, Lengths],
    prompt_tokens: Mapping[str, float],
    steps: int,
    episodes: int,
    micro_batches: int,
    window: int = 2,
    seed: int = 0,
    keep_edge: Callable[[SimTask, SimTask], bool] | None = None,
) -> SimRun:
    """Run the pipeline's graph for `steps` steps on simulated workers (`keep_edge`: a
    what-if filter on its edges, see `SimExecutor`)."""
    run = dict(
        mode=arm.mode,
        staleness=arm.staleness,
        seed=seed,
        steps=steps,
        episodes_per_step=episodes,
        micro_batches=micro_batches,
        window=window,
        balance=arm.balance,
        elastic=arm.elastic,
    )
    ctx = RunContext(
        run_id=f"sim-{spec.name}-{arm.mode}",
        store_url="memory://sim",
        spec=spec.with_run(**run),
        train_slots=layout.train_slots,
    )
    bodies = SimBodies(
        spec, costs, lengths, prompt_tokens, layout.accel, layout.train_slots, seed, ctx.run_id
    )
    ex = SimExecutor(bodies, layout.workers, costs.dispatch_s, costs.cores, keep_edge)
    pipe = Pipeline(ctx, layout.pins(), ex)
    for k in range(steps):
        pipe.wait_window(k)
        pipe.submit_rollout(k)
        pipe.submit_training(k)
    results = pipe.finish()
    ts = timings(results)
    rows = per_step(results, 0.0)
    step_s, util = steady_state(ts, rows, layout.accel, ex.active)
    counts = {
        "tasks": len(ts),
        "swaps": bodies.swaps,
        "loads": bodies.loads,
        "switches": bodies.switches,
        "handovers": bodies.handovers,
        "rebalances": int(getattr(pipe.place.balancer, "changes", 0)),
        "reverts": int(getattr(pipe.place.balancer, "reverts", 0)),
    }
    ends = [t.end for t in ts if t.phase == "optimizer_step"]
    first = max(t.end for t in ts if t.phase == "optimizer_step" and t.step == 0)
    mean = (max(ends) - first) / (steps - 1) if steps > 1 else max(ends)
    return SimRun(step_s, mean, util, max(t.end for t in ts), tuple(ts), tuple(rows), counts)
