"""`python -m bench.sim.balance [--small] [--json PATH]`: where balancing moves hosts.

The paper-scale scenarios (`bench.sim`) give every agent 2 rollout workers and 4
micro-batches a step: every agent's tasks already run in 2 rounds and a moved host buys
nothing, so the balancer stays put there. This sweep asks where it does act: chain, fanout
and routed MEGs at 4 and 16 micro-batches a step, on 128 and 768 accelerators, flex with and
without balancing, side by side, for `steps` steps (long enough for a trial to settle).
`balance_gain` = flex without balancing over flex (step time); > 1: balancing pays.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.sim.costs import profile
from bench.sim.paper import Setting, run_mode
from bench.sim.scenarios import WORKLOADS

FULL = dict(
    scenarios=(("routed", 5), ("routed", 9), ("fanout", 9), ("chain", 9)),
    micro_batches=(4, 16),
    accel=(128, 768),
    steps=16,
)
SMALL = dict(scenarios=(("routed", 5),), micro_batches=(4,), accel=(128,), steps=4)


def sweep(plan: dict[str, Any]) -> dict[str, Any]:
    acc = profile("acc-64g")
    rows = []
    for mbs in plan["micro_batches"]:
        for accel in plan["accel"]:
            for wl, n in plan["scenarios"]:
                sc = WORKLOADS[wl](n)
                sc = dataclasses.replace(
                    sc, micro_batches=mbs, spec=sc.spec.with_run(micro_batches=mbs)
                )
                setting = Setting(accel, plan["steps"])
                runs = {m: run_mode(sc, m, n, setting, acc) for m in ("flex", "flex-nobalance")}
                flex, off = runs["flex"].mean_step_s, runs["flex-nobalance"].mean_step_s
                rows.append(
                    {
                        "scenario": sc.name,
                        "micro_batches": mbs,
                        "accelerators": accel,
                        "flex_s": round(float(flex), 2),
                        "flex_nobalance_s": round(float(off), 2),
                        "balance_gain": round(float(off / flex), 3),
                        "changes": runs["flex"].counts["rebalances"],
                        "undone": runs["flex"].counts["reverts"],
                    }
                )
    gains = [r["balance_gain"] for r in rows]
    return {
        "date": str(date.today()),
        "machine": platform.node(),
        "steps": plan["steps"],
        "rows": rows,
        "balance_gain_min": min(gains),
        "balance_gain_max": max(gains),
    }


def render(res: dict[str, Any]) -> None:
    t = Table(title=f"flex with vs without balancing, {res['steps']} simulated steps")
    for col in ("scenario", "micro-batches", "accelerators", "flex s", "no balancing s", "gain"):
        t.add_column(col)
    for r in res["rows"]:
        t.add_row(
            r["scenario"],
            str(r["micro_batches"]),
            str(r["accelerators"]),
            f"{r['flex_s']:.1f}",
            f"{r['flex_nobalance_s']:.1f}",
            f"{r['balance_gain']:.3f} ({r['changes']} changes, {r['undone']} undone)",
        )
    Console().print(t)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="one configuration (the test's run)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    res = sweep(SMALL if a.small else FULL)
    render(res)
    if a.json:
        from bench.common import write_results

        write_results(res, a.json)
    return res


if __name__ == "__main__":
    main()
