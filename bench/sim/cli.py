"""`python -m bench.sim [--small] [--paper] [--json PATH] [--e2e PATH] [--plots DIR ...]`.

`--paper`: only the paper's table (`paper_table.py`): every number the FlexMARL paper
publishes that the model predicts, MA and CA at the paper's work, and `paper_ratio_error`.

1. Validation: replays every arm `bench/e2e.py` measured (`--e2e`, default
   bench/results/e2e.json) on the `cpu-here` profile; `calibration_error` per arm.
2. The paper's setting on `acc-64g`: 48 nodes × 16 accelerators, agents of 14B and 32B,
   global batch 64 in micro-batches of 16, chain, fanout and routed MEGs of 3 to 15 agents, in
   sync, marti-like, flex, flex without balancing and async(η=1).
3. Scaling curves over agents (1 → 15) and accelerators (64 → 768), as PNGs.

`--small`: one small scenario and two-point curves (the test suite's run).
"""

from __future__ import annotations

import argparse
import os
import platform
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.sim.costs import profile
from bench.sim.paper import KEYS, Setting, curve, scenario_row
from bench.sim.paper_table import paper_table, render_paper
from bench.sim.plots import scaling_plot
from bench.sim.scenarios import PAPER_ACCEL
from bench.sim.validate import summary, validate

# measured runs nothing was fitted on: MARTI's whole-batch schedule (bench/e2e.py, 2026-12-07)
HELDOUT = (Path("bench/results/e2e_layout.json"),)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one invocation runs."""

    scenarios: tuple[tuple[str, int], ...]  # (workload, agents)
    accel: int
    steps: int
    agent_points: tuple[int, ...]
    accel_points: tuple[int, ...]
    curve_workload: str = "fanout"
    curve_agents: int = 5  # agents of the accelerator curve


FULL = Plan(
    scenarios=tuple((wl, n) for wl in ("chain", "fanout", "routed") for n in (3, 9, 15)),
    accel=PAPER_ACCEL,
    steps=8,
    agent_points=(1, 3, 5, 7, 9, 11, 13, 15),
    accel_points=(64, 128, 256, 384, 512, 768),
)
SMALL = Plan(
    scenarios=(("chain", 3),),
    accel=64,
    steps=3,
    agent_points=(1, 3),
    accel_points=(64, 128),
    curve_agents=3,
)


def run(
    plan: Plan, e2e: Path | None, plots: list[Path], heldout: tuple[Path, ...] = HELDOUT
) -> dict[str, Any]:
    acc = profile("acc-64g")
    out: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "accelerators": plan.accel,
        "steps": plan.steps,
    }
    if e2e is not None and e2e.is_file():
        out["validation"] = validate(e2e, heldout=heldout)
        out["calibration_error"] = {k: v["error"] for k, v in out["validation"].items()}
        out["validation_summary"] = summary(out["validation"])
    setting = Setting(plan.accel, plan.steps)
    out["scenarios"] = {}
    for wl, n in plan.scenarios:
        row = scenario_row(wl, n, setting, acc)
        out["scenarios"][row["scenario"]] = row
    rows = out["scenarios"].values()
    # the paper's headline: FlexMARL over MAS-RL, 7.3× (MA) and 5.6× (CA), in step time
    out["paper_flex_over_baseline_max"] = max(r["speedup_vs_masrl"] for r in rows)
    out["paper_utilization_ratio_max"] = max(r["utilization_ratio_vs_masrl"] for r in rows)
    out["paper_figures"] = {"flex_over_masrl": [7.3, 5.6], "flex_over_marti": [1.38, 1.43]}
    agents = [(n, plan.accel) for n in plan.agent_points]
    accels = [(plan.curve_agents, a) for a in plan.accel_points]
    out["curves"] = {
        "workload": plan.curve_workload,
        "agents": curve(plan.curve_workload, agents, plan.steps, acc),
        "accelerators": curve(plan.curve_workload, accels, plan.steps, acc),
    }
    out["plots"] = []
    for folder in plots:
        wl = plan.curve_workload
        a = scaling_plot(
            out["curves"]["agents"],
            "agents",
            f"{wl}, {plan.accel} accelerators",
            folder / "sim_scaling_agents.png",
        )
        b = scaling_plot(
            out["curves"]["accelerators"],
            "accelerators",
            f"{wl}, {plan.curve_agents} agents",
            folder / "sim_scaling_accelerators.png",
        )
        out["plots"] += [str(a), str(b)]
    return out


SHORT = ("sync", "marti", "flex", "flex-nb", "async-1", "mas-rl")  # KEYS, as column titles


def render(res: dict[str, Any]) -> None:
    con = Console()
    if "validation" in res:
        t = Table(title="validation: predicted vs measured step_s (bench/e2e.py, cpu-here)")
        for col in ("workload/arm", "role", "measured s", "repeats", "predicted s", "error"):
            t.add_column(col, justify="left" if col == "workload/arm" else "right")
        for arm, v in res["validation"].items():
            t.add_row(
                arm,
                v["role"],
                f"{v['measured_s']:.3f}",
                " ".join(f"{x:.2f}" for x in v["measured_repeats"]),
                f"{v['predicted_s']:.3f}",
                f"{100 * v['error']:+.1f}%",
            )
        con.print(t)
        con.print(f"validation: {res['validation_summary']}")
    t = Table(
        title=f"paper scale: {res['accelerators']} accelerators (acc-64g), mean step time (s)"
    )
    cols = ("scenario", *SHORT, "vs sync", "vs marti", "vs mas-rl", "util flex", "util sync")
    for col in cols:
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for name, r in res["scenarios"].items():
        t.add_row(
            name,
            *(f"{r[k]:.1f}" for k in KEYS.values()),
            f"{r['speedup_vs_sync']:.2f}×",
            f"{r['speedup_vs_marti']:.2f}×",
            f"{r['speedup_vs_masrl']:.2f}×",
            f"{r['utilization']['flex']:.2f}",
            f"{r['utilization']['sync']:.2f}",
        )
    con.print(t)
    for p in res["plots"]:
        con.print(f"plot: {p}")


def paper_main(small: bool, json_path: Path | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"steps": 3, "seeds": 1, "with_sensitivity": False} if small else {}
    res = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        **paper_table(**kw),
    }
    render_paper(res)
    if json_path:
        from bench.common import write_results

        write_results(res, json_path)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="one small scenario (the test's run)")
    ap.add_argument(
        "--paper",
        action="store_true",
        help="the paper's table only: MA and CA at the paper's work, every published number "
        "the model predicts, paper_ratio_error (with --small: 3 steps, 1 seed, no sensitivity)",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--e2e", type=Path, default=Path("bench/results/e2e.json"))
    ap.add_argument(
        "--heldout",
        type=Path,
        action="append",
        help="measured runs nothing was fitted on, replayed as held-out checks (repeatable; "
        "default bench/results/e2e_layout.json; a missing file is skipped)",
    )
    ap.add_argument(
        "--plots",
        type=Path,
        action="append",
        help="folder for the PNGs (repeatable; default: bench/results and docs/assets, or "
        "with --small the JSON's folder)",
    )
    a = ap.parse_args(argv)
    if a.paper:
        return paper_main(a.small, a.json)
    plots = a.plots or (
        ([a.json.parent] if a.json else [])
        if a.small
        else [Path("bench/results"), Path("docs/assets")]
    )
    heldout = tuple(a.heldout) if a.heldout is not None else HELDOUT
    res = run(SMALL if a.small else FULL, a.e2e, plots, heldout)
    render(res)
    if a.json:
        from bench.common import write_results  # imports the train flow: only when writing

        write_results(res, a.json)
    return res
