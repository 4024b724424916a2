"""Long-tail rollouts: the policies against the baseline, side by side in one run.

    python -m bench.longtail [--small] [--steps N] [--episodes N] [--repeats R] [--json PATH]

Of the issue's five arms (baseline, APRIL, GRESO, zero-advantage skipping, all three) only
two exist yet: `baseline` and `zero_adv` (`loss.skip_zero_advantage: true` for every
agent); APRIL and GRESO are not built (docs/limits.md). Each arm trains the same
warm-started model on the same workload — the long-tail workload (`longtail`) and
`fanout` — for the same steps on a fresh default local cluster, interleaved `R` times.

Per arm (medians over repeats): `step_s` (median step time over steps ≥ 1), `train_s`
(the training tasks' time, summed over the run), `decode_tokens_per_step`,
`zero_adv_fraction` (of the rows trained, from the store), `team_reward_last`, and the
consistency audit. Keys (long-tail workload, zero_adv over baseline):
`skip_train_time_ratio`, `zero_adv_step_time_ratio`, and `zero_adv_fraction`; the same
under `fanout` for fanout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from bench.common import train_run, write_results
from bench.e2e import steady_state
from flows.cli import main as cli
from flows.cluster import ClusterConfig, dask_cluster, prefect_api
from storage.store import MEGStore
from workloads import BUILTIN

ARMS = ("baseline", "zero_adv")
WORKLOADS = ("longtail", "fanout")


def build_model(workload: str, out: Path, warm_steps: int | None) -> str:
    """A seeded tiny model warm-started on `workload`'s format (its preset unless given)."""
    model = out / f"model-{workload}"
    args = ["tiny-model", str(model), "--warm-start", workload]
    if cli(args + ([] if warm_steps is None else ["--warm-steps", str(warm_steps)])) != 0:
        raise SystemExit(f"building the {workload} model failed")
    return str(model)


def config_copy(workload: str, arm: str, model: str, out: Path, steps: int, eps: int) -> Path:
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
        if arm == "zero_adv":
            agent["loss"] = {**agent.get("loss", {}), "skip_zero_advantage": True}
    data["run"] = {"steps": steps, "episodes_per_step": eps, "micro_batches": 2, "mode": "flex"}
    path = out / f"{workload}-{arm}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def zero_adv_fraction(summary: dict[str, Any]) -> float:
    """The fraction of stored rows (every agent, every step) with advantage exactly 0."""
    store = MEGStore.open(summary["store_url"], summary["run_id"], create=False)
    adv = np.concatenate([store.table(a).read().advantage for a in store.agents()])
    return round(float(np.mean(adv == 0)), 4)


def run_arm(cfg: Path, run_dir: Path) -> dict[str, Any]:
    with dask_cluster(ClusterConfig()) as workers:
        out = train_run(cfg, run_dir, workers.address)
    tasks = json.loads((run_dir / "timeline.json").read_text())
    st = steady_state(out, run_dir)
    return {
        "step_s": st["step_s"],
        "train_s": round(sum(t["end"] - t["start"] for t in tasks if t["phase"] == "train"), 3),
        "decode_tokens_per_step": statistics.mean(r["decode_tokens"] for r in out["per_step"]),
        "zero_adv_fraction": zero_adv_fraction(out),
        "team_reward_last": st["team_reward_last"],
        "violations": st["violations"],
    }


def ratios(arms: dict[str, dict[str, Any]]) -> dict[str, float]:
    base, skip = arms["baseline"], arms["zero_adv"]
    return {
        "skip_train_time_ratio": round(skip["train_s"] / base["train_s"], 4),
        "zero_adv_step_time_ratio": round(skip["step_s"] / base["step_s"], 4),
        "zero_adv_fraction": base["zero_adv_fraction"],
    }


def run(
    steps: int, episodes: int, repeats: int, warm_steps: int | None, work: Path
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "steps": steps,
        "episodes_per_step": episodes,
        "repeats": repeats,
        "arms": list(ARMS),
        "not_built": ["april", "greso", "all_three"],
    }
    with prefect_api():
        models = {w: build_model(w, work, warm_steps) for w in WORKLOADS}
        for w in WORKLOADS:
            runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
            for rep in range(repeats):
                for arm in ARMS:
                    cfg = config_copy(w, arm, models[w], work, steps, episodes)
                    runs[arm].append(run_arm(cfg, work / f"{w}-{arm}-{rep}"))
            arms = {
                a: {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]}
                | {"repeats": rs}
                for a, rs in runs.items()
            }
            results[w] = {"arms": arms, **ratios(arms)}
    results |= {k: v for k, v in results["longtail"].items() if k != "arms"}
    return results


def render(results: dict[str, Any]) -> None:
    t = Table(
        title=f"long-tail rollouts · {results['steps']} steps × {results['episodes_per_step']} "
        f"episodes · median of {results['repeats']}"
    )
    cols = ("workload", "arm", "step s", "train s", "decode tok/step", "zero-adv", "reward")
    for col in cols:
        t.add_column(col, justify="left" if col in ("workload", "arm") else "right")
    for w in WORKLOADS:
        for arm, r in results[w]["arms"].items():
            t.add_row(
                w,
                arm,
                f"{r['step_s']:.2f}",
                f"{r['train_s']:.1f}",
                f"{r['decode_tokens_per_step']:.0f}",
                f"{r['zero_adv_fraction']:.2f}",
                f"{r['team_reward_last']:.3f}",
            )
    Console().print(t)
    for w in WORKLOADS:
        r = results[w]
        print(
            f"{w}: zero-adv fraction {r['zero_adv_fraction']:.2f}, training time "
            f"{r['skip_train_time_ratio']:.3f}x, step time {r['zero_adv_step_time_ratio']:.3f}x"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="2 steps × 4 episodes, 2 warm steps")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default="bench/results/longtail.json")
    args = p.parse_args(argv)
    steps, episodes, repeats, warm = (
        (2, 4, 1, 2) if args.small else (args.steps, args.episodes, args.repeats, None)
    )
    with tempfile.TemporaryDirectory(prefix="flexmarl-longtail-") as tmp:
        results = run(steps, episodes, repeats, warm, Path(tmp))
    render(results)
    write_results(results, args.json)
    return results


if __name__ == "__main__":
    main()
