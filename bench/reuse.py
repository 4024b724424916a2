"""A long-lived cluster serving run after run: does any process grow?

    python -m bench.reuse [--runs N] [--workload math-chain] [--json PATH]

One local cluster (as a deployment's Dask cluster is), N short training runs of the same
config one after another, each worker's RSS (and the driver's) sampled after every run.
`cluster_reuse_rss_growth` = the largest relative growth of any worker between run 3 and run N
(runs 1–3 fill caches: engines, trainers, the allocator's pools). Target ≤ 0.10 at N = 20.
With several configs in turn (`--workload a,b`) each config's runs are compared with its own.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from bench.common import cpu_model, train_run, write_results
from bench.rss import rss_bytes
from workloads import BUILTIN

BASELINE_RUN = 3  # growth is measured from after this run


def short_config(out: Path, model: str, workload: str) -> Path:
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
    data["run"] = {"steps": 2, "episodes_per_step": 4, "micro_batches": 2}
    path = out / f"{workload}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def worker_rss(client: Any) -> dict[str, int]:
    """RSS of every worker process, by worker name."""
    by_address = client.run(rss_bytes)
    names = {a: str(w.get("name")) for a, w in client.scheduler_info()["workers"].items()}
    return {names[a]: rss for a, rss in by_address.items()}


def growth(
    samples: list[dict[str, int]], baseline: int = BASELINE_RUN, configs: int = 1
) -> dict[str, float]:
    """Relative RSS growth per process from after run `baseline` to after the last run; with
    `configs` configs run in turn, each config's own runs are compared (its first run from
    `baseline` on against its last) and the largest growth is kept. Why: a worker's size
    after a run depends on the config it served (the engines it holds), so run 3 of one
    config against run 12 of another measures the configs, not growth (+29.6% was reported
    that way on 2026-12-05 for math-chain and fanout in turn, +7.8% like with like)."""
    out: dict[str, float] = {}
    for c in range(configs):
        runs = [i for i in range(baseline - 1, len(samples)) if i % configs == c]
        if len(runs) < 2:
            continue
        first, last = samples[runs[0]], samples[runs[-1]]
        for p in first.keys() & last.keys():
            out[p] = max(out.get(p, -1.0), round(last[p] / first[p] - 1, 4))
    return dict(sorted(out.items()))


def reuse(
    runs: int, workload: str, tmp: Path, model: str, scheduler: str | None = None
) -> dict[str, Any]:
    """N runs on one cluster; RSS per process after each. `workload`: one name, or several
    separated by commas, run in turn (each change of models rebuilds the engines).
    `scheduler`: the runs on the running cluster at that address (1 rollout + 1 training
    worker, as `ClusterConfig()` starts it: the test suite's session cluster), else on a
    default local cluster started here."""
    from distributed import Client

    from flows.cluster.start import ClusterConfig, dask_cluster

    cfgs = [short_config(tmp, model, w) for w in workload.split(",")]
    samples: list[dict[str, int]] = []
    config = ClusterConfig(scheduler=scheduler) if scheduler else ClusterConfig()
    with dask_cluster(config) as workers, Client(workers.address) as client:
        for i in range(runs):
            train_run(cfgs[i % len(cfgs)], tmp / f"run-{i}", workers.address)
            samples.append({**worker_rss(client), "driver": rss_bytes()})
            mib = {p: round(v / 2**20) for p, v in samples[-1].items()}
            print(f"run {i + 1}/{runs}: RSS MiB {mib}", flush=True)
    return {"samples": samples, "growth": growth(samples, configs=len(cfgs))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--workload", default="math-chain", help="one, or several comma-separated")
    ap.add_argument("--json", default="bench/results/reuse.json")
    args = ap.parse_args()
    from flows.cluster.start import prefect_api
    from workloads.tiny_model import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-reuse-"))
    model = str(build_tiny_model(tmp / "tiny", seed=0))
    with prefect_api():
        out = reuse(args.runs, args.workload, tmp, model)
    workers = {p: g for p, g in out["growth"].items() if p != "driver"}
    result = {
        "date": date.today().isoformat(),
        "machine": cpu_model(),
        "runs": args.runs,
        "workload": args.workload,
        "rss_mib": [{p: round(v / 2**20, 1) for p, v in s.items()} for s in out["samples"]],
        "growth": out["growth"],
        "cluster_reuse_rss_growth": max(workers.values()),
    }
    print(f"growth from run {BASELINE_RUN} to run {args.runs}: {out['growth']}")
    write_results(result, args.json)


if __name__ == "__main__":
    main()
