"""What experiment tracking costs: the same run with no tracker and with every tracker.

    python -m bench.tracking [--steps N] [--repeats R] [--json PATH]

math-chain on the tiny model (hf backend), one local cluster shared by all runs, arms
interleaved over repeats (`off`, `on`, `off`, `on`, ...). `step_s`: median completion
interval of steps >= 1. `tracking_step_time_ratio` = on / off (target <= 1.03).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from bench.common import cpu_model, train_run, write_results
from workloads import BUILTIN

ARMS = {"off": [], "on": ["tensorboard", "wandb", "mlflow"]}


def config(out: Path, model: str, steps: int, tracking: list[str]) -> Path:
    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    for agent in data["agents"].values():
        agent.update(model=model, backend="hf")
    data["run"] = {"steps": steps, "episodes_per_step": 8, "micro_batches": 2, "tracking": tracking}
    path = out / f"math-chain-{'-'.join(tracking) or 'off'}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def step_s(summary: dict[str, Any]) -> float:
    return round(statistics.median(r["wall_s"] for r in summary["per_step"] if r["step"] >= 1), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="bench/results/tracking.json")
    args = ap.parse_args()
    from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api
    from workloads.tiny_model import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    model = str(build_tiny_model(tmp / "tiny", seed=0))
    cfgs = {arm: config(tmp, model, args.steps, names) for arm, names in ARMS.items()}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with prefect_api(), dask_cluster(ClusterConfig()) as workers:
        for r in range(args.repeats):
            for arm, cfg in cfgs.items():
                summary = train_run(cfg, tmp / f"{arm}-{r}", workers.address)
                times[arm].append(step_s(summary))
                print(f"repeat {r} {arm}: step {times[arm][-1]:.3f} s")
    med = {arm: round(statistics.median(ts), 4) for arm, ts in times.items()}
    result = {
        "date": date.today().isoformat(),
        "machine": cpu_model(),
        "steps": args.steps,
        "repeats": args.repeats,
        "step_s": med,
        "step_s_repeats": times,
        "tracking_step_time_ratio": round(med["on"] / med["off"], 4),
    }
    print(f"tracking_step_time_ratio {result['tracking_step_time_ratio']} (target <= 1.03)")
    write_results(result, args.json)


if __name__ == "__main__":
    main()
