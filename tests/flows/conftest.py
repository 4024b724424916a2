"""Shared real components for the orchestrator tests: one tiny model (session-scoped; the
Prefect server, the Dask cluster and the long-tail model are the whole suite's, in
tests/conftest.py; each test makes its own run directory and store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from workloads import BUILTIN


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from workloads.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


def write_config(
    tmp: Path, model: str, workload: str = "math-chain", *, backend: str | None = None, **run: Any
) -> Path:
    """A copy of a built-in workload with every agent on `model` and small run sizes (and,
    for math-chain, 4 solver samples: the row counts below are counted by hand for it).

    `backend="hf"` for the fault and resume tests that start clusters of their own: what they
    test is the orchestrator and the store, and importing vLLM plus an engine per agent in
    every fresh worker was a third of each such run (the session cluster's tests, the
    engine tests and the benchmarks keep vLLM covered)."""
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
        if backend is not None:
            agent["backend"] = backend
    if workload == "math-chain":
        data["nodes"]["solve"]["n"] = 4
    data["run"] = {"steps": 3, "episodes_per_step": 4, "micro_batches": 2, **run}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{workload}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def use_backend(meg: Path, backend: str) -> None:
    """Rewrite the MEG file `meg` with every agent on rollout backend `backend`."""
    data = yaml.safe_load(meg.read_text())
    for agent in data["agents"].values():
        agent["backend"] = backend
    meg.write_text(yaml.safe_dump(data))


def run_store(run_dir: Path) -> Any:
    """The store of the run `flexmarl train` is making in `run_dir`, or None before it has
    written its record and created its store (what a kill predicate polls)."""
    import json

    from storage.errors import StoreError
    from storage.store import MEGStore

    try:
        rec = json.loads((run_dir / "run.json").read_text())
        return MEGStore.open(rec["store_url"], rec["run_id"], create=False)
    except (FileNotFoundError, StoreError):
        return None


# `kill_cli_train_when(..., cluster=ONE_WORKER)`: the run's own cluster is one worker that
# both generates and trains. For a test of what a resume makes of the store, where the killed
# run ran does not matter, and its second worker process was a quarter of such a test's CPU
# (18 of 63 s for a 4-step longtail run, measured here on 2 cores).
ONE_WORKER = ("--colocate",)


def kill_cli_train_when(
    predicate: Callable[[], bool],
    cfg: Path,
    run_dir: Path,
    api: str,
    log: Path,
    what: str,
    entry: Sequence[str] = ("-m", "flows.cli"),
    cluster: Sequence[str] = ("--rollout-workers", "1"),
) -> None:
    """Run `flexmarl train CFG --run-dir RUN_DIR CLUSTER...` (`python ENTRY train ...`) as
    its own process group and SIGKILL all of it (the CLI, its cluster, its workers) once
    `predicate()` holds; fails with the run's log tail if the run ends first or after 300 s.
    `cluster`: the cluster flags, by default the two-worker cluster (these tests are about
    resume; every further rollout worker is one more engine to start, ~15 s of a test on 2
    cores); `ONE_WORKER` one colocated worker; `()` lets the run lay its cluster out
    itself."""
    env = {**os.environ, "PREFECT_API_URL": api}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, *entry, "train", str(cfg), "--run-dir", str(run_dir), *cluster],
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        end = time.time() + 300
        while not predicate():
            if proc.poll() is not None and not predicate():
                raise AssertionError(
                    f"the run ended (exit {proc.returncode}) before {what}\n"
                    f"{log.read_text()[-3000:]}"
                )
            if time.time() > end:
                raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
