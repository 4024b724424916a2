"""What the benchmarks share: one short training run on a given cluster, and the results
file every benchmark writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flows.cluster import ClusterConfig
from flows.train import TrainParams, train


def train_run(cfg: Path, run_dir: Path, scheduler: str, **params: Any) -> dict[str, Any]:
    """`flexmarl train CFG` into `run_dir` on the cluster at `scheduler`, no final export
    (a benchmark measures the run, not the export); returns the run's summary."""
    return train(
        TrainParams(
            config=str(cfg),
            run_dir=str(run_dir),
            export_final=False,
            cluster=ClusterConfig(scheduler=scheduler),
            **params,
        )
    )


def write_results(results: dict[str, Any], path: str | Path) -> None:
    """The benchmark's JSON at `path` (folders made), and a line saying where."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=2))
    print(f"results written to {path}")
