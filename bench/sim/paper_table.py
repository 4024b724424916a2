"""The paper's published numbers, predicted: `python -m bench.sim --paper [--json F]`.

Every number of the FlexMARL paper (arXiv 2602.09578 v1, Tables 2–4, §8) that the model can
predict becomes one row: the paper's value, ours, their ratio, and whether a constant was
set from it (`fitted`: then it is not a check). `paper_ratio_error` is the geometric-mean
error of the six unfitted ratios the paper's argument rests on — FlexMARL over MARTI, over
itself without load balancing, over itself without the asynchronous pipeline, on MA and
CA: exp(mean |ln(predicted / paper)|) − 1. Nothing is tuned to those ratios.

A prediction is the mean over `seeds` draws of the response lengths (each a run of `steps`
steps, step time the mean completion interval over steps ≥ 1); a ratio row also gives the
range of its per-seed values.

MAS-RL is the paper's baseline whose schedule it does not publish: each of our assumptions
(`paper_setting.SYSTEMS`, `mas-rl/*`) is its own row, and `masrl_needs` names those whose
FlexMARL-over-MAS-RL ratio is within 25% of the paper's 7.3× (MA) and 5.6× (CA) on both.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

from bench.sim.calibration import ACC_64G, EFFICIENCY, Efficiency, Hardware
from bench.sim.paper_setting import (
    BASE,
    PAPER_ACCEL,
    QUERIES,
    SYSTEMS,
    WORKLOADS,
    Assumptions,
    System,
)
from bench.sim.replay import SimRun, simulate
from bench.sim.scenarios import BIG

# The paper's numbers (Tables 2 and 3, §8).
PAPER_STEP_S: dict[str, dict[str, float]] = {
    "MA": {
        "mas-rl": 914.4,
        "marti": 174.1,
        "flexmarl": 126.1,
        "flexmarl-nobalance": 152.2,
        "flexmarl-noasync": 256.2,
    },
    "CA": {
        "mas-rl": 438.6,
        "marti": 112.8,
        "flexmarl": 78.8,
        "flexmarl-nobalance": 95.9,
        "flexmarl-noasync": 124.1,
    },
}
PAPER_MA_THROUGHPUT = {"mas-rl": 119.0, "flexmarl": 910.2}  # generated tokens/s
PAPER_UTILIZATION = {"MA": 0.324, "CA": 0.198}  # FlexMARL's average active-core time
PAPER_SWAP_32B_S = 11.0  # weights + optimizer state, device ↔ host, "about 11 s in total"
SWAP_DEVICES = 16  # ASSUMED: a 32B training state held by one node's 16 devices
RATIOS = {  # key → (numerator system, denominator system): the unfitted checks
    "over_marti": ("marti", "flexmarl"),
    "over_nobalance": ("flexmarl-nobalance", "flexmarl"),
    "over_noasync": ("flexmarl-noasync", "flexmarl"),
}
LABELS = {
    "over_marti": "over MARTI",
    "over_nobalance": "over no balancing",
    "over_noasync": "over no async",
}
MASRL_TOLERANCE = 0.25
STEPS, SEEDS = 12, 3


def run_system(
    wl: str, sys: System, steps: int, accel: int, seed: int = 0, a: Assumptions = BASE
) -> SimRun:
    sc = WORKLOADS[wl](a)
    n_agents = len(sc.spec.agents)
    return simulate(
        sc.spec,
        sys.arm,
        sys.devices(n_agents, accel),
        sys.costs(a),
        sc.lengths,
        sc.prompt_tokens,
        steps,
        sc.episodes,
        sys.micro_batches or sc.micro_batches,
        seed=seed,
    )


def geo_error(pairs: list[tuple[float, float]]) -> float:
    """exp(mean |ln(predicted / paper)|) − 1 over (predicted, paper) pairs."""
    return math.exp(sum(abs(math.log(p / q)) for p, q in pairs) / len(pairs)) - 1


def _row(
    item: str, paper: float | None, values: list[float], fitted: bool, note: str = ""
) -> dict[str, Any]:
    pred = statistics.fmean(values)
    return {
        "item": item,
        "paper": paper,
        "predicted": round(float(pred), 3),
        "spread": [round(float(min(values)), 3), round(float(max(values)), 3)],
        "ratio": round(float(pred / paper), 3) if paper else None,
        "fitted": fitted,
        "note": note,
    }


Runs = dict[tuple[str, str, int], SimRun]


def simulate_all(steps: int, seeds: int, accel: int, a: Assumptions = BASE) -> Runs:
    return {
        (wl, name, seed): run_system(wl, s, steps, accel, seed, a)
        for wl in WORKLOADS
        for name, s in SYSTEMS.items()
        for seed in range(seeds)
    }


def one_seed(runs: Runs, seed: int) -> Runs:
    """The runs of one seed, relabelled seed 0."""
    return {(wl, n, 0): r for (wl, n, s), r in runs.items() if s == seed}


def ratio_values(runs: Runs, wl: str, num: str, den: str, seeds: int) -> list[float]:
    return [runs[(wl, num, s)].mean_step_s / runs[(wl, den, s)].mean_step_s for s in range(seeds)]


def ratio_error(runs: Runs, seeds: int) -> float:
    """`paper_ratio_error` of a set of runs (mean ratio over seeds against the paper's)."""
    pairs = []
    for wl, paper in PAPER_STEP_S.items():
        for num, den in RATIOS.values():
            pred = statistics.fmean(ratio_values(runs, wl, num, den, seeds))
            pairs.append((pred, paper[num] / paper[den]))
    return geo_error(pairs)


def paper_rows(runs: Runs, seeds: int, a: Assumptions = BASE) -> list[dict[str, Any]]:
    """Every predictable number of the paper, one row each."""
    rows: list[dict[str, Any]] = []
    steps = {
        k: [runs[(*k, s)].mean_step_s for s in range(seeds)] for k in {(wl, n) for wl, n, _ in runs}
    }
    masrl = [n for n in SYSTEMS if n.startswith("mas-rl")]
    for wl, paper in PAPER_STEP_S.items():
        for name, sys in SYSTEMS.items():
            ref = paper["mas-rl" if name in masrl else name]
            rows.append(_row(f"{wl} step s, {name}", ref, steps[(wl, name)], False, sys.what))
        for key, (num, den) in RATIOS.items():
            ref = round(paper[num] / paper[den], 3)
            values = ratio_values(runs, wl, num, den, seeds)
            rows.append(_row(f"{wl} FlexMARL {LABELS[key]}", ref, values, False, "counted"))
        for name in masrl:
            ref = round(paper["mas-rl"] / paper["flexmarl"], 3)
            values = ratio_values(runs, wl, name, "flexmarl", seeds)
            rows.append(_row(f"{wl} FlexMARL over {name}", ref, values, False, "an assumption"))
        util = [runs[(wl, "flexmarl", s)].utilization for s in range(seeds)]
        rows.append(_row(f"{wl} FlexMARL active time", PAPER_UTILIZATION[wl], util, False))
    for name, ref in PAPER_MA_THROUGHPUT.items():
        for s in masrl if name == "mas-rl" else [name]:
            tput = [a.tokens_per_step / x for x in steps[("MA", s)]]
            rows.append(_row(f"MA tok/s, {s}", ref, tput, True, "tokens/step set from the paper"))
    swap = 2 * a.physics.swap(BIG, SWAP_DEVICES)
    note = f"16 B/param over {SWAP_DEVICES} devices' host links"
    rows.append(_row("32B training-state swap s (out + in)", PAPER_SWAP_32B_S, [swap], False, note))
    return rows


def masrl_needs(runs: Runs, seeds: int) -> tuple[dict[str, list[float]], list[str]]:
    """Each workload's range of FlexMARL over the MAS-RL assumptions, and the assumptions
    within `MASRL_TOLERANCE` of the paper's ratio on every workload."""
    masrl = [n for n in SYSTEMS if n.startswith("mas-rl")]
    mean = {
        (wl, n): statistics.fmean(ratio_values(runs, wl, n, "flexmarl", seeds))
        for wl in WORKLOADS
        for n in masrl
    }
    paper = {wl: p["mas-rl"] / p["flexmarl"] for wl, p in PAPER_STEP_S.items()}
    span = {
        wl: [
            round(min(mean[(wl, n)] for n in masrl), 3),
            round(max(mean[(wl, n)] for n in masrl), 3),
        ]
        for wl in WORKLOADS
    }
    tol = math.log(1 + MASRL_TOLERANCE)
    needs = [
        n for n in masrl if all(abs(math.log(mean[(wl, n)] / paper[wl])) <= tol for wl in WORKLOADS)
    ]
    return span, needs


def _hw(hw: Hardware) -> Assumptions:
    return replace(BASE, physics=replace(BASE.physics, hw=hw))


def _eff(eff: Efficiency) -> Assumptions:
    return replace(BASE, physics=replace(BASE.physics, eff=eff))


# Each unpublished input moved to a plausible other value, one at a time.
SENSITIVITY: dict[str, Assumptions] = {
    "prompt 128 tokens": replace(BASE, prompt_tokens=128),
    "prompt 2,048 tokens": replace(BASE, prompt_tokens=2048),
    "length spread σ 0.7": replace(BASE, sigma=0.7),
    "length spread σ 1.3": replace(BASE, sigma=1.3),
    "sub-agent shares even": replace(BASE, shares=(1 / 3, 1 / 3, 1 / 3)),
    "sub-agent shares 0.8/0.15/0.05": replace(BASE, shares=(0.8, 0.15, 0.05)),
    "HBM 1.2 TB/s": _hw(replace(ACC_64G, hbm_bps=1.2e12)),
    "training MFU 0.25": _eff(replace(EFFICIENCY, train_mfu=0.25)),
    "training MFU 0.5": _eff(replace(EFFICIENCY, train_mfu=0.5)),
    "RoCE 12.5 GB/s per device": _hw(replace(ACC_64G, inter_bps=12.5e9)),
}


def sensitivity(steps: int, seeds: int, accel: int) -> dict[str, float]:
    """`paper_ratio_error` with each `SENSITIVITY` change alone."""
    return {
        k: round(ratio_error(simulate_all(steps, seeds, accel, a), seeds), 4)
        for k, a in SENSITIVITY.items()
    }


def paper_table(
    steps: int = STEPS, seeds: int = SEEDS, accel: int = PAPER_ACCEL, with_sensitivity: bool = True
) -> dict[str, Any]:
    runs = simulate_all(steps, seeds, accel)
    span, needs = masrl_needs(runs, seeds)
    per_seed = [ratio_error(one_seed(runs, s), 1) for s in range(seeds)]
    hw: Hardware = BASE.physics.hw
    eff: Efficiency = BASE.physics.eff
    out: dict[str, Any] = {
        "setting": {
            "accelerators": accel,
            "steps": steps,
            "seeds": seeds,
            "queries_per_step": QUERIES,
            "tokens_per_step": BASE.tokens_per_step,
            "prompt_tokens": BASE.prompt_tokens,
            "sigma": round(BASE.sigma, 4),
            "shares": [round(x, 4) for x in BASE.shares],
            "hardware": hw.name,
            "efficiency": {"hbm": eff.hbm, "train_mfu": eff.train_mfu},
        },
        "paper_table": paper_rows(runs, seeds),
        "paper_ratio_error": round(ratio_error(runs, seeds), 4),
        "ratios": {
            wl: {
                k: round(statistics.fmean(ratio_values(runs, wl, num, den, seeds)), 3)
                for k, (num, den) in RATIOS.items()
            }
            for wl in WORKLOADS
        },
        "paper_ratios": {
            wl: {k: round(p[num] / p[den], 4) for k, (num, den) in RATIOS.items()}
            for wl, p in PAPER_STEP_S.items()
        },
        "paper_ratio_error_per_seed": [round(e, 4) for e in per_seed],
        "paper_ratio_checks": len(PAPER_STEP_S) * len(RATIOS),
        "masrl_range": span,
        "masrl_needs": needs,
        "counts": {f"{wl}/{n}": r.counts for (wl, n, s), r in runs.items() if s == 0},
    }
    if with_sensitivity:
        out["paper_ratio_error_sensitivity"] = sensitivity(steps, seeds, accel)
    return out


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def render_paper(res: dict[str, Any]) -> None:
    """The table as the paper would print it, then the error and the MAS-RL reading."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"the paper's numbers, predicted ({res['setting']})")
    for col in ("item", "paper", "predicted", "spread", "ratio", "fitted"):
        t.add_column(col, justify="left" if col == "item" else "right")
    for r in res["paper_table"]:
        lo, hi = r["spread"]
        t.add_row(
            r["item"],
            _fmt(r["paper"]),
            _fmt(r["predicted"]),
            f"{_fmt(lo)}–{_fmt(hi)}",
            _fmt(r["ratio"]),
            "fitted" if r["fitted"] else "",
        )
    con.print(t)
    con.print(
        f"paper_ratio_error {res['paper_ratio_error']:.3f} over {res['paper_ratio_checks']} "
        f"unfitted ratios (per seed {res['paper_ratio_error_per_seed']})"
    )
    con.print(f"FlexMARL over the MAS-RL assumptions: {res['masrl_range']}")
    con.print(f"MAS-RL assumptions within 25% of 7.3x and 5.6x: {res['masrl_needs'] or 'none'}")
    for k, v in res.get("paper_ratio_error_sensitivity", {}).items():
        con.print(f"  paper_ratio_error with {k}: {v:.3f}")
