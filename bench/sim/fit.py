"""Fit `cpu-here`'s constants from real runs.

    python -m bench.sim.fit lengths RUN_DIR...            # response lengths, from stores
    python -m bench.sim.fit tasks --runs RUNS [--arm flex]  # task costs, from timelines

`lengths` reads the stores of `flexmarl train` run directories: per workload node, the
quantiles of the response lengths and the prompt tokens before the parents' answers.
`tasks` reads the `<workload>-<arm>-<repeat>.timeline.json` files `bench/e2e.py` keeps
(`bench/results/e2e_runs.json`: its folder of runs, packed), steps ≥ 1 only (step 0 loads
models), and fits
`calibration.LinearFit` by non-negative least squares: a task's tokens come from its MEG
(rows per micro-batch) and the length quantiles, since a timeline names a task's agent and
micro-batch but not its tokens. The workers' effective cores are fitted twice: from single
tasks of the `--shared-arm` (`effective_cores`) and, what `calibration.py` uses, from the
step times of the two in-sample arms (`step_fit_cores`: the simulator replays `--arm` and
`--shared-arm` at each candidate value). The printed constants are pasted into
`calibration.py` by hand, with the date and the runs: the simulator never reads a run at
run time.

Only agents with one node are fitted (a timeline's generate interval names its agent, not
its node); the built-in math-chain and fanout are such MEGs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.packed import members
from bench.sim.calibration import EMPIRICAL_LENGTHS, EMPIRICAL_PROMPTS
from meg import MEGSpec, expand_episode
from storage.store import MEGStore
from tasks.context import LEGACY_PHASES

QUANTILES = 11  # 0, 0.1, ..., 1


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients ≥ 0: refit without the features that came out
    negative until none does (enough for a handful of well-scaled features)."""
    keep = np.ones(x.shape[1], bool)
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            return coef
        keep &= coef > 0


# ---- lengths, from stores ----------------------------------------------------------------
def store_lengths(run_dir: Path) -> tuple[str, dict[str, list[float]], dict[str, float]]:
    """(workload, node → length quantiles, node → own prompt tokens) of one run."""
    rec = json.loads((run_dir / "run.json").read_text())
    spec = MEGSpec.model_validate(rec["spec"])
    store = MEGStore.open(rec["store_url"], rec["run_id"])
    resp: dict[str, np.ndarray] = {}
    prompt: dict[str, float] = {}
    for node, nspec in spec.nodes.items():
        b = store.table(nspec.agent).read(node=node)
        keep = b.step >= 1
        resp[node] = b.response_lengths[keep].astype(float)
        prompt[node] = float(b.prompt_lengths[keep].mean())
    qs = {
        n: [round(float(q), 2) for q in np.quantile(r, np.linspace(0, 1, QUANTILES))]
        for n, r in resp.items()
    }
    own = {  # the template's own tokens: the mean prompt minus the parents' mean answers
        n: round(max(1.0, prompt[n] - sum(float(resp[p].mean()) for p in s.inputs)), 2)
        for n, s in spec.nodes.items()
    }
    return spec.name, qs, own


# ---- task costs, from timelines ----------------------------------------------------------
def worker_gaps(tasks: list[dict[str, Any]], limit: float = 0.25) -> list[float]:
    """Idle gaps between consecutive tasks of one worker, shorter than `limit`: the
    scheduler round trip when the next task was already waiting."""
    out: list[float] = []
    by: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        by.setdefault(t["worker"], []).append(t)
    for ts in by.values():
        ts.sort(key=lambda t: t["start"])
        out += [b["start"] - a["end"] for a, b in itertools.pairwise(ts)]
    return [g for g in out if 0 <= g < limit]


def node_tokens(spec: MEGSpec, episodes_per_mb: float) -> dict[str, tuple[float, float]]:
    """node → (expected response tokens, expected prompt tokens) of one micro-batch."""
    per = {n: len(s) for n, s in expand_episode(spec).samples.items()}
    lengths: Mapping[str, tuple[float, ...]] = EMPIRICAL_LENGTHS[spec.name]
    mean = {n: float(np.mean(lengths[n])) for n in spec.nodes}
    out = {}
    for n, s in spec.nodes.items():
        rows = episodes_per_mb * per[n]
        prompt = EMPIRICAL_PROMPTS[spec.name][n] + sum(mean[p] for p in s.inputs)
        out[n] = (rows * mean[n], rows * prompt)
    return out


def task_rows(spec: MEGSpec, tasks: list[dict[str, Any]], episodes_per_mb: float) -> dict[str, Any]:
    """Features and seconds per phase of one timeline (steps ≥ 1)."""
    tokens = node_tokens(spec, episodes_per_mb)
    node_of = {a: [n for n, s in spec.nodes.items() if s.agent == a] for a in spec.agents}
    gen, train = [], []
    for t in tasks:
        nodes = node_of.get(t["agent"], [])
        seconds = t["end"] - t["start"]
        if t["phase"] == "generate" and len(nodes) == 1:
            gen.append((1.0, *tokens[nodes[0]], seconds))
        elif t["phase"] == "train_micro_batch":
            train.append((1.0, sum(sum(tokens[n]) for n in nodes), seconds))
    return {
        "gen": gen,
        "train": train,
        "score": [t["end"] - t["start"] for t in tasks if t["phase"] == "score"],
        "step": [t["end"] - t["start"] for t in tasks if t["phase"] == "optimizer_step"],
        "gaps": worker_gaps(tasks),
    }


def concurrency(t: dict[str, Any], tasks: list[dict[str, Any]]) -> float:
    """Mean number of tasks running during `t` (itself included)."""
    a, b = t["start"], t["end"]
    return sum(max(0.0, min(b, u["end"]) - max(a, u["start"])) for u in tasks) / (b - a)


def effective_cores(base: list[list[dict[str, Any]]], shared: list[list[dict[str, Any]]]) -> float:
    """How many cores the worker processes behave as if they shared, from processor
    sharing's slowdown = running / cores: each task of the `shared` timelines (many
    workers on this machine's CPUs, e.g. `marti-like`) that ran beside ≥ 2.5 others on
    average, against the median time of its (phase, agent) in the `base` timelines."""
    ref: dict[tuple[str, str], list[float]] = {}
    for tasks in base:
        for t in tasks:
            ref.setdefault((t["phase"], t["agent"]), []).append(t["end"] - t["start"])
    est = []
    for tasks in shared:
        for t in tasks:
            key, seconds = (t["phase"], t["agent"]), t["end"] - t["start"]
            if key in ref and seconds > 0 and (n := concurrency(t, tasks)) >= 2.5:
                est.append(n / max(1.0, seconds / statistics.median(ref[key])))
    return statistics.median(est) if est else float("nan")


def fit_tasks(parts: list[dict[str, Any]]) -> dict[str, float]:
    g = np.array([row for p in parts for row in p["gen"]])
    t = np.array([row for p in parts for row in p["train"]])
    gc, tc = nnls(g[:, :3], g[:, 3]), nnls(t[:, :2], t[:, 2])
    return {
        "gen_task": float(gc[0]),
        "gen_token": float(gc[1]),
        "gen_prompt": float(gc[2]),
        "score_task": statistics.median(s for p in parts for s in p["score"]),
        "train_task": float(tc[0]),
        "train_token": float(tc[1]),
        "step_task": statistics.median(s for p in parts for s in p["step"]),
        "dispatch": statistics.median(x for p in parts for x in p["gaps"]),
        "generate_tasks": len(g),
        "train_tasks": len(t),
    }


def timelines(runs: Path, workload: str, arm: str) -> list[list[dict[str, Any]]]:
    """Every repeat's tasks of steps ≥ 1 of one workload and arm, from a folder of runs or
    the file `bench.packed` made of it."""
    name = re.compile(rf"{re.escape(workload)}-{re.escape(arm)}-\d+\.timeline\.json")
    files = members(runs)
    return [
        [
            t | {"phase": LEGACY_PHASES.get(t["phase"], t["phase"])}
            for t in files[f]
            if t["step"] >= 1
        ]
        for f in sorted(files)
        if name.fullmatch(f)
    ]


def e2e_fit(
    runs: Path, arm: str, shared_arm: str, specs: Mapping[str, MEGSpec], episodes_per_mb: float
) -> dict[str, float]:
    """Task costs from `arm`'s timelines of every workload in `specs`, and the effective
    cores from `shared_arm`'s (one worker per agent) against `arm`'s."""
    parts = [
        task_rows(spec, tasks, episodes_per_mb)
        for wl, spec in specs.items()
        for tasks in timelines(runs, wl, arm)
    ]
    out = fit_tasks(parts)
    cores = [
        effective_cores(timelines(runs, wl, arm), timelines(runs, wl, shared_arm)) for wl in specs
    ]
    known = [c for c in cores if not math.isnan(c)]
    out["effective_cores"] = statistics.median(known) if known else float("nan")
    return out


def best_cores(errors_at: Callable[[float], list[float]], grid: Sequence[float]) -> float:
    """The grid value whose relative errors have the smallest sum of squares (the first
    one on a tie): a one-parameter fit, small enough to search."""
    return min(grid, key=lambda c: sum(e * e for e in errors_at(c)))


def step_fit_cores(
    fitted: Mapping[str, float], e2e_json: Path, arms: tuple[str, ...], cpus: int
) -> float:
    """Effective cores fitted to the measured step times of the in-sample `arms` (with the
    task costs just fitted): the simulator itself predicts each arm at every candidate
    value. Unlike `effective_cores` (a median over single tasks), this weighs what a step
    waits for, which is what validation compares."""
    import dataclasses

    from bench.sim.calibration import CPU_HERE
    from bench.sim.costs import LinearCosts
    from bench.sim.validate import e2e_specs, predict

    res = json.loads(e2e_json.read_text())
    specs, sizes = e2e_specs(e2e_json)
    fields = (f.name for f in dataclasses.fields(CPU_HERE))
    base = dataclasses.replace(CPU_HERE, **{k: float(fitted[k]) for k in fields if k in fitted})

    def errors_at(cores: float) -> list[float]:
        costs = LinearCosts(dataclasses.replace(base, cores=cores))
        out = []
        for wl, spec in specs.items():
            for arm in arms:
                measured = float(res["workloads"][wl]["arms"][arm]["step_s"])
                out.append(predict(spec, arm, sizes, costs) / measured - 1)
        return out

    return best_cores(errors_at, [round(1 + 0.02 * i, 2) for i in range(int(50 * (cpus - 1)) + 1)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="what", required=True)
    ln = sub.add_parser("lengths", help="length quantiles from run stores")
    ln.add_argument("runs", nargs="+", type=Path)
    tk = sub.add_parser("tasks", help="task costs from e2e timelines")
    tk.add_argument("--runs", type=Path, default=Path("bench/results/e2e_runs.json"))
    tk.add_argument("--arm", default="flex", help="the arm whose task times are fitted")
    tk.add_argument("--shared-arm", default="marti-like", help="the arm that fits effective cores")
    tk.add_argument("--e2e", type=Path, default=Path("bench/results/e2e.json"))
    a = ap.parse_args(argv)
    if a.what == "lengths":
        out: dict[str, Any] = {"lengths": {}, "prompts": {}}
        for d in a.runs:
            wl, qs, own = store_lengths(d)
            out["lengths"][wl], out["prompts"][wl] = qs, own
    else:
        from bench.sim.validate import e2e_specs

        specs, sizes = e2e_specs(a.e2e)
        out = e2e_fit(a.runs, a.arm, a.shared_arm, specs, sizes.episodes / sizes.micro_batches)
        cpus = int(json.loads(a.e2e.read_text()).get("cpus") or 2)
        out["step_fit_cores"] = step_fit_cores(out, a.e2e, (a.arm, a.shared_arm), cpus)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
