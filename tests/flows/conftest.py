"""Shared real components for the orchestrator tests: one Prefect server, one tiny model,
one Dask cluster with a rollout and a training worker (session-scoped; each test makes its
own run directory and store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from workloads import BUILTIN


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from workloads.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def cluster(prefect_server: str) -> Iterator[str]:
    """Scheduler address of a local cluster started exactly as `flexmarl train` starts one."""
    from flows.cluster import ClusterConfig, dask_cluster

    with dask_cluster(ClusterConfig()) as workers:
        yield workers.address


def write_config(tmp: Path, model: str, workload: str = "math-chain", **run: Any) -> Path:
    """A copy of a built-in workload with every agent on `model` and small run sizes (and,
    for math-chain, 4 solver samples: the row counts below are counted by hand for it)."""
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
    if workload == "math-chain":
        data["nodes"]["solve"]["n"] = 4
    data["run"] = {"steps": 3, "episodes_per_step": 4, "micro_batches": 2, **run}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{workload}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
