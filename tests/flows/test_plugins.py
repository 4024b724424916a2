"""A workload of the user's own — rewards module, JSONL data, made by `flexmarl init` —
validated and trained on a local cluster and on a cluster whose workers run in another
directory and cannot import the module by themselves (the driver ships it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flows.cli.main import main
from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.store import MEGStore
from tests.flows.conftest import use_backend

pytestmark = pytest.mark.slow

MARK = 0.25  # a reward value no built-in function returns: proof the plugin scored


def train_two_steps(meg: Path, run_dir: Path, scheduler: str) -> dict:
    """Two steps of `meg` on the cluster at `scheduler`, no final export."""
    return train(
        TrainParams(
            config=str(meg),
            steps=2,
            run_dir=str(run_dir),
            cluster=ClusterConfig(scheduler=scheduler),
            export_final=False,
        )
    )


def starter(tmp_path: Path, name: str, tiny_model: str, backend: str | None = None) -> Path:
    """`flexmarl init NAME` on the tiny model, its solver reward a marker; `backend`: every
    agent's rollout backend instead of the starter's own."""
    assert main(["init", str(tmp_path / name), "--model", tiny_model]) == 0
    meg = tmp_path / name / f"{name}.yaml"
    if backend is not None:
        use_backend(meg, backend)
    rewards = tmp_path / name / f"{name}_rewards.py"
    rewards.write_text(  # the solver's reward: a marker value, so the test can see who scored
        rewards.read_text().replace(
            "    return float(answer_of(sample.text) == task.answer.strip())",
            f"    return {MARK}",
        )
    )
    assert main(["meg", "validate", str(meg)]) == 0
    return meg


def check_run(out: dict, name: str) -> None:
    assert out["steps"] == 2 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    solver = store.table("solver").read()
    assert len(solver) == 2 * 8 * 4 and np.all(solver.reward == MARK)
    checker = store.table("checker").read()
    assert set(np.unique(checker.reward)) <= {0.0, 1.0}  # judged_right ran too


def test_starter_workload_trains_on_a_local_cluster(
    tmp_path: Path, tiny_model: str, cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    meg = starter(tmp_path, "mine", tiny_model)
    assert "valid MEG 'mine'" in capsys.readouterr().out
    assert main(["init", str(tmp_path / "mine")]) == 2  # never overwrites
    assert "not empty" in capsys.readouterr().err
    out = train_two_steps(meg, tmp_path / "run", cluster)
    check_run(out, "mine")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["spec"]["plugins"] == [str((tmp_path / "mine" / "mine_rewards.py").resolve())]
    assert record["spec"]["dataset"]["url"] == str((tmp_path / "mine" / "tasks.jsonl").resolve())


@pytest.fixture
def foreign_cluster(tmp_path: Path, prefect_server: str) -> Iterator[str]:
    """`dask scheduler` and two `dask worker`s (rollout, train) as separate processes whose
    working directory is an empty folder of their own."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
    }
    env.pop("PYTHONPATH", None)
    sched_file = tmp_path / "scheduler.json"
    bindir = Path(sys.executable).parent
    procs = [
        subprocess.Popen(
            [
                str(bindir / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--scheduler-file",
                str(sched_file),
            ],
            cwd=elsewhere,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        end = time.time() + 60
        while not sched_file.exists() and time.time() < end:
            time.sleep(0.2)
        for name, role in (("rollout-0", "rollout"), ("train-0", "train")):
            procs.append(
                subprocess.Popen(
                    [
                        str(bindir / "dask"),
                        "worker",
                        "--scheduler-file",
                        str(sched_file),
                        "--nthreads",
                        "1",
                        "--name",
                        name,
                        "--resources",
                        f"{role}=1 {name}=1",
                        "--local-directory",
                        str(elsewhere / name),
                    ],
                    cwd=elsewhere,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield json.loads(sched_file.read_text())["address"]
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_starter_workload_trains_where_workers_cannot_see_the_driver_directory(
    tmp_path: Path, tiny_model: str, foreign_cluster: str
) -> None:
    from distributed import Client

    # transformers rollout: what this tests is where the plugin is found, not the engine
    meg = starter(tmp_path, "theirs", tiny_model, backend="hf")
    with Client(foreign_cluster) as client:
        client.wait_for_workers(2, timeout=120)

        def visible() -> tuple[bool, str]:
            import importlib.util
            import os

            return importlib.util.find_spec("theirs_rewards") is not None, os.getcwd()

        seen = client.run(visible)
    assert all(not found for found, _ in seen.values())  # the module is not theirs to import
    assert all(cwd != os.getcwd() for _, cwd in seen.values())
    out = train_two_steps(meg, tmp_path / "run", foreign_cluster)
    check_run(out, "theirs")
