"""A long-lived cluster does not grow: 20 short runs on one local cluster (as a deployment's
Dask cluster serves run after run), every worker's RSS after run 20 within 10% of after
run 3 (the first runs fill caches: engines, trainers, pools)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.reuse import BASELINE_RUN, reuse

pytestmark = pytest.mark.slow


def test_twenty_runs_on_one_cluster_do_not_grow_its_workers(
    tmp_path: Path, tiny_model: str, prefect_server: str
) -> None:
    out = reuse(20, "math-chain", tmp_path, tiny_model)
    samples = out["samples"]
    assert len(samples) == 20 and BASELINE_RUN == 3
    workers = {p: g for p, g in out["growth"].items() if p != "driver"}
    assert {"rollout-0", "train-0"} <= set(workers)
    mib = [{p: round(v / 2**20) for p, v in s.items()} for s in samples]
    assert max(workers.values()) <= 0.10, f"RSS growth {workers}; MiB per run {mib}"
