"""Elastic training allocation on a workload whose agents' training demand differs strongly.

    python -m bench.elastic [--steps N] [--repeats R] [--json PATH]

The workload (`skewed_training_meg`): a solver on a wide model, a checker on a tiny one and a
critic on the wide one; the critic reads the solver's answer and trains on 2 verdicts per
solver sample, so its training is the heaviest, the checker's the lightest (about 1 : 0.1 :
1.7 training seconds per step on the 2-core VM). The fixed placement puts units round-robin
in need order (solver, checker, critic), so the two wide agents share training worker 0.

Two clusters, each with and without `run.elastic`, side by side in one run (interleaved
over repeats, so a machine-wide slowdown hits every arm alike):

    split     1 rollout + 2 training workers: the allocator moves a wide agent off the
              shared training worker
    shared    1 rollout + 1 training worker (the default cluster): capacity moves between
              the roles, a unit's training going to the rollout worker

`step_s` is the mean completion interval of the second half of the steps (after any move
and its trial); `elastic_speedup_<cluster>` = fixed step_s / elastic step_s. Each arm also
reports its moves (agent, first step on the new worker, from, to), the bytes handed over,
and the consistency audit.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from bench.common import cpu_model, train_run, write_results
from workloads import BUILTIN

CLUSTERS = {"split": {"rollout_workers": 1, "train_workers": 2}, "shared": {}}


def build_models(out: Path) -> tuple[str, str]:
    """The tiny model and a wide one (about 20x the parameters), same tokenizer."""
    from workloads.tiny_model import build_tiny_model

    small, wide = out / "small", out / "wide"
    if not small.exists():
        build_tiny_model(small, seed=0)
    if not wide.exists():
        build_tiny_model(wide, seed=0, layers=4, hidden=384, heads=4, intermediate=1024)
    return str(small), str(wide)


def skewed_training_meg(small: str, wide: str, **run: Any) -> dict[str, Any]:
    """math-chain plus a critic: solver (wide) → check (checker, tiny) and critique (critic,
    wide), both judging the solver's answer. hf backend (what is measured is training)."""
    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    solver, verifier = data["agents"]["solver"], data["agents"].pop("verifier")
    data["name"] = "skewed-training"
    data["agents"] = {
        "solver": {**solver, "model": wide, "backend": "hf"},
        "checker": {**verifier, "model": small, "backend": "hf"},
        "critic": {**verifier, "model": wide, "backend": "hf"},
    }
    verify = data["nodes"].pop("verify")
    data["nodes"]["solve"]["n"] = 4
    data["nodes"]["check"] = {**verify, "agent": "checker"}
    data["nodes"]["critique"] = {**verify, "agent": "critic"}
    reward = data["rewards"].pop("verify")
    data["rewards"].update(check=reward, critique=reward)
    data["run"] = {"steps": 8, "episodes_per_step": 8, "micro_batches": 2, **run}
    return data


def steady_step_s(summary: dict[str, Any]) -> float:
    """Mean completion interval of the second half of the steps (step 0 loads models)."""
    rows = [r["wall_s"] for r in summary["per_step"] if r["step"] >= 1]
    return round(statistics.fmean(rows[len(rows) // 2 :]), 3)


def run_arm(cfg: Path, out: Path, cluster: dict[str, int], elastic: bool) -> dict[str, Any]:
    from flows.cluster.start import ClusterConfig, dask_cluster

    with dask_cluster(ClusterConfig(**cluster)) as workers:
        summary = train_run(cfg, out, workers.address, elastic=elastic)
    return {
        "step_s": steady_step_s(summary),
        "wall_s": round(summary["wall_s"], 2),
        "moves": [[h["agent"], h["step"], h["source"], h["target"]] for h in summary["handovers"]],
        "handed_over_mib": round(sum(h["mib"] for h in summary["handovers"]), 1),
        "violations": summary["consistency"]["violations"],
        "team_reward_last": summary["per_step"][-1]["team_reward"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default="bench/results/elastic.json")
    args = ap.parse_args()
    from flows.cluster.start import prefect_api

    tmp = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    small, wide = build_models(tmp / "models")
    cfg = tmp / "skewed.yaml"
    cfg.write_text(yaml.safe_dump(skewed_training_meg(small, wide, steps=args.steps)))
    arms = [(c, e) for c in CLUSTERS for e in (False, True)]
    runs: dict[str, list[dict[str, Any]]] = {}
    with prefect_api():
        for r in range(args.repeats):
            for cluster, elastic in arms:
                name = f"{cluster}-{'elastic' if elastic else 'fixed'}"
                out = tmp / f"{name}-{r}"
                runs.setdefault(name, []).append(run_arm(cfg, out, CLUSTERS[cluster], elastic))
                shutil.rmtree(out, ignore_errors=True)
    result = report(runs, args)
    write_results(result, args.json)


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    arms = {
        name: {
            "step_s": round(statistics.median(r["step_s"] for r in rs), 3),
            "step_s_repeats": [r["step_s"] for r in rs],
            "moves": rs[-1]["moves"],
            "handed_over_mib": rs[-1]["handed_over_mib"],
            "violations": max(r["violations"] for r in rs),
            "team_reward_last": rs[-1]["team_reward_last"],
        }
        for name, rs in runs.items()
    }
    table = Table(title="elastic training allocation (skewed-training workload)")
    for col in ("arm", "step s", "repeats", "moves (agent, step, from, to)", "MiB", "violations"):
        table.add_column(col)
    for name, a in arms.items():
        moves = "; ".join(f"{m[0]}@{m[1]} {m[2]}→{m[3]}" for m in a["moves"]) or "—"
        table.add_row(
            name,
            f"{a['step_s']:.3f}",
            str(a["step_s_repeats"]),
            moves,
            str(a["handed_over_mib"]),
            str(a["violations"]),
        )
    Console().print(table)
    ratios = {
        f"elastic_speedup_{c}": round(
            arms[f"{c}-fixed"]["step_s"] / arms[f"{c}-elastic"]["step_s"], 3
        )
        for c in CLUSTERS
    }
    print(ratios)
    return {
        "date": date.today().isoformat(),
        "machine": cpu_model(),
        "steps": args.steps,
        "repeats": args.repeats,
        "arms": arms,
        **ratios,
    }


if __name__ == "__main__":
    main()
