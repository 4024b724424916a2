"""The paper-scale runs: every mode on one scenario, and the scaling curves.

The paper's headline compares FlexMARL with MAS-RL; `mas-rl-like` is our assumption of it
(`scenarios.whole_cluster`: agents serialized on the whole cluster, whole batch at once).

A scenario's step time is the *mean* completion interval over steps ≥ 1 (`SimRun.
mean_step_s`), not the median `bench/e2e.py` reports: async(η) completes steps in bursts
(two close together, then a gap), and the median of a few such intervals is either burst or
gap. On the measured arms (validation) the median is kept, to compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bench.sim.costs import Costs
from bench.sim.physics import PhysicsCosts
from bench.sim.replay import SimRun, simulate
from bench.sim.scenarios import MODES, WORKLOADS, Scenario

KEYS = {  # mode → JSON key of its step time
    "sync": "sync_s",
    "marti-like": "marti_like_s",
    "flex": "flex_s",
    "flex-nobalance": "flex_nobalance_s",
    "flex-elastic": "flex_elastic_s",
    "async-1": "async_s",
    "mas-rl-like": "mas_rl_like_s",
}


@dataclass(frozen=True, slots=True)
class Setting:
    accel: int
    steps: int


def run_mode(
    sc: Scenario,
    mode: str,
    n_agents: int,
    setting: Setting,
    costs: Costs,
) -> SimRun:
    m = MODES[mode]
    if isinstance(costs, PhysicsCosts):
        costs = replace(costs, schedule=m.schedule)
    return simulate(
        sc.spec,
        m.arm,
        m.layout(n_agents, setting.accel),
        costs,
        sc.lengths,
        sc.prompt_tokens,
        setting.steps,
        sc.episodes,
        m.micro_batches or sc.micro_batches,
    )


def scenario_row(workload: str, n_agents: int, setting: Setting, costs: Costs) -> dict[str, Any]:
    """Every mode on one scenario: step times, speedups, utilization, what the runs did."""
    sc = WORKLOADS[workload](n_agents)
    runs = {mode: run_mode(sc, mode, n_agents, setting, costs) for mode in MODES}
    s = {mode: r.mean_step_s for mode, r in runs.items()}
    return {
        "scenario": sc.name,
        "agents": n_agents,
        "accelerators": setting.accel,
        **{KEYS[mode]: round(v, 2) for mode, v in s.items()},
        "speedup_vs_sync": round(s["sync"] / s["flex"], 3),
        "speedup_vs_marti": round(s["marti-like"] / s["flex"], 3),
        "speedup_vs_masrl": round(s["mas-rl-like"] / s["flex"], 3),
        "utilization_ratio_vs_masrl": round(
            runs["flex"].utilization / runs["mas-rl-like"].utilization, 3
        ),
        "balance_gain": round(s["flex-nobalance"] / s["flex"], 3),
        "elastic_gain": round(s["flex"] / s["flex-elastic"], 3),
        "async_gain": round(s["flex"] / s["async-1"], 3),
        "utilization": {mode: round(r.utilization, 4) for mode, r in runs.items()},
        "counts": {mode: r.counts for mode, r in runs.items()},
    }


CURVE_MODES = ("sync", "marti-like", "flex")


def curve(
    workload: str, points: list[tuple[int, int]], steps: int, costs: Costs
) -> list[dict[str, Any]]:
    """Step time per mode at each (agents, accelerators) point."""
    out = []
    for n, accel in points:
        sc = WORKLOADS[workload](n)
        setting = Setting(accel, steps)
        row: dict[str, Any] = {"agents": n, "accelerators": accel}
        for mode in CURVE_MODES:
            row[KEYS[mode]] = round(run_mode(sc, mode, n, setting, costs).mean_step_s, 2)
        out.append(row)
    return out
