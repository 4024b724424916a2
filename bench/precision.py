"""bfloat16 learns like float32: the same built-in workload, seed and cluster, trained once
with every agent in float32 and once in bfloat16 (float32 masters, bf16 compute, bf16
rollout weights: engines/training/train_config.py), reward curves side by side.

    python -m bench.precision --json bench/results/precision.json --png bench/results/precision.png

Needs the workload's model (`make models` builds models/tiny-math). Prints a table of the
team reward per arm (first and last steps, gain) and writes the curves.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from bench.common import cpu_model, train_run, write_results
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api
from workloads import BUILTIN

DTYPES = ("float32", "bfloat16")


def config_in(workload: str, dtype: str, model: str | None, steps: int, out: Path) -> Path:
    """The workload's MEG with every agent in `dtype` (and on `model`, if given)."""
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["dtype"] = dtype
        if model:
            agent["model"] = model
        elif not Path(agent["model"]).is_absolute():
            agent["model"] = str(Path(agent["model"]).resolve())
    data["run"] = {**data.get("run", {}), "steps": steps}
    path = out / f"{workload}-{dtype}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def curve(summary: dict[str, Any]) -> list[float]:
    return [float(r["team_reward"]) for r in summary["per_step"]]


def run(workload: str, steps: int, model: str | None, work: Path) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    with prefect_api(), dask_cluster(ClusterConfig()) as cluster:
        for dtype in DTYPES:
            cfg = config_in(workload, dtype, model, steps, work)
            summary = train_run(cfg, work / dtype, cluster.address, seed=0)
            rewards = curve(summary)
            k = max(1, min(10, len(rewards) // 4))
            arms[dtype] = {
                "team_reward": rewards,
                "first": sum(rewards[:k]) / k,
                "last": sum(rewards[-k:]) / k,
                "wall_s": summary["wall_s"],
                "audit_violations": summary["consistency"]["violations"],
            }
            arms[dtype]["gain"] = arms[dtype]["last"] - arms[dtype]["first"]
    fp32, bf16 = arms["float32"], arms["bfloat16"]
    return {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpu": cpu_model(),
        "workload": workload,
        "steps": steps,
        "arms": arms,
        "bf16_gain_over_fp32_gain": bf16["gain"] / fp32["gain"] if fp32["gain"] else None,
        "bf16_last_minus_fp32_last": bf16["last"] - fp32["last"],
    }


def plot(results: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for dtype, arm in results["arms"].items():
        ax.plot(arm["team_reward"], label=dtype, alpha=0.85)
    ax.set_xlabel("step")
    ax.set_ylabel("team reward")
    ax.set_title(f"{results['workload']}: float32 vs bfloat16 (float32 masters), same seed")
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def render(results: dict[str, Any]) -> None:
    print(f"{'dtype':<10} {'first':>7} {'last':>7} {'gain':>7} {'wall s':>8} {'audit':>6}")
    for dtype, a in results["arms"].items():
        print(
            f"{dtype:<10} {a['first']:>7.3f} {a['last']:>7.3f} {a['gain']:>7.3f} "
            f"{a['wall_s']:>8.1f} {a['audit_violations']:>6}"
        )
    print(f"bf16 gain / fp32 gain: {results['bf16_gain_over_fp32_gain']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="math-chain", choices=sorted(BUILTIN))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument(
        "--model", default=None, help="HF model dir for every agent (default: the MEG's)"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flexmarl-precision-") as tmp:
        results = run(args.workload, args.steps, args.model, Path(tmp))
    render(results)
    if args.png:
        plot(results, Path(args.png))
    if args.json:
        write_results(results, args.json)
    return results


if __name__ == "__main__":
    main()
