"""A real run with `run.tracking: [tensorboard, wandb, mlflow]`: TensorBoard's scalars read
back with TensorBoard's reader, the wandb offline run's records parsed back with wandb's
own, the MLflow run read from a real `mlflow server` (started here) with MLflow's client and
its run page rendered in headless Chromium; a server that goes away mid-run costs metrics,
not the run; a run that raises ends its wandb run with exit code 1."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flows.cluster.start import ClusterConfig
from flows.report import tracking
from flows.report.trackers import SQLALCHEMY_NOISE
from flows.train import TrainParams, train
from tests.flows.conftest import write_config
from tests.flows.report.test_tracking import REFS
from tests.flows.test_ui import free_port, render

pytestmark = [
    pytest.mark.slow,
    # the tests read the server's SQLite store with MLflow's own client: what the tracker
    # silences where it opens one (SQLALCHEMY_NOISE)
    *(pytest.mark.filterwarnings(f"ignore:{message}") for message in SQLALCHEMY_NOISE),
]


def wandb_records(run_dir: Path, timeout: float = 60.0) -> dict[str, list[Any]]:
    """The records of the run's offline wandb file, by type (history, config, artifact...),
    once the file holds the run's `exit` record.

    `run.finish()` returns when wandb-core has handled the exit, but the stream's writer
    closes the file afterwards, on its own (the finish notice to the service is
    fire-and-forget): on a loaded machine the last records land a moment later. So the file
    is read until its `exit` record is there, for up to `timeout` seconds.

    wandb 0.30 dropped its Python reader (its core is Go now), so the file is read here: a
    7-byte header (":W&B", magic, version), then LevelDB-log records in 32 KiB blocks — a
    7-byte record header (CRC, little-endian length, type FULL/FIRST/MIDDLE/LAST) and its
    piece of one protobuf `Record`. A record still being written (cut short) is left off."""
    [path] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    end = time.monotonic() + timeout
    while "exit" not in (records := _wandb_file_records(path.read_bytes())):
        assert time.monotonic() < end, f"{path} has no exit record after {timeout:.0f} s"
        time.sleep(0.2)
    return records


def _wandb_file_records(data: bytes) -> dict[str, list[Any]]:
    from wandb.proto import wandb_internal_pb2

    assert data[:4] == b":W&B"
    pos, block, pieces, out = 7, 32768, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # still being written
            break
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pieces)
            out.setdefault(rec.WhichOneof("record_type"), []).append(rec)
            pieces = b""
    return out


class MLflowServer:
    """`mlflow server` on a free loopback port, its store and artifacts under `root`."""

    def __init__(self, root: Path) -> None:
        self.db = root / "mlflow.db"
        self.url = f"http://127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
               "--port", self.url.rsplit(":", 1)[1], "--workers", "1",
               "--backend-store-uri", f"sqlite:///{self.db}",
               "--artifacts-destination", str(root / "artifacts")]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        end = time.time() + 120
        while True:
            assert self.proc.poll() is None, f"mlflow server exited with {self.proc.returncode}"
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5):
                    return
            except OSError:
                assert time.time() < end, "mlflow server did not answer in 120 s"
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:
    """One server for the module (~7 s to start); the test of a server that goes away
    stops it, after the others used it."""
    server = MLflowServer(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        server.stop()


def item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def test_a_tracked_run_logs_every_step_and_agent(
    tmp_path: Path,
    tiny_model: str,
    cluster: str,
    mlflow_server: MLflowServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=3, episodes_per_step=4)
    data = yaml.safe_load(cfg.read_text())
    data["run"]["tracking"] = ["tensorboard", "wandb", "mlflow"]
    cfg.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "tracked-run"
    out = train(
        TrainParams(config=str(cfg), run_dir=str(run_dir), cluster=ClusterConfig(scheduler=cluster))
    )

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for agent in ("solver", "verifier"):
        for name in ("reward", "loss", "grad_norm", "entropy_mc", "tokens_per_s", "staleness"):
            points = events.Scalars(f"{agent}/{name}")
            assert [p.step for p in points] == [0, 1, 2], (agent, name)
    rewards = [p.value for p in events.Scalars("team/reward")]
    assert rewards == pytest.approx([r["team_reward"] for r in out["per_step"]], abs=1e-4)
    assert [p.value for p in events.Scalars("solver/staleness")] == [0, 0, 0]  # flex
    assert "final/solver/text_summary" in events.Tags()["tensors"]

    records = wandb_records(run_dir)
    history = [{item_key(i): i.value_json for i in r.history.item} for r in records["history"]]
    assert [h["_step"] for h in history] == ["0", "1", "2"]
    assert all("solver/reward" in h and "verifier/loss" in h for h in history)
    config = {i.key for r in records["config"] for i in r.config.update}
    assert {"meg.run.mode", "sources.steps", "cluster.train_workers"} <= config
    artifacts = {r.artifact.name for r in records.get("artifact", [])}
    assert {"solver-final", "verifier-final"} <= artifacts

    client = MlflowClient(tracking_uri=mlflow_server.url)
    exp = client.get_experiment_by_name(data["name"])
    assert exp is not None
    [run] = client.search_runs([exp.experiment_id])
    rid = run.info.run_id
    for agent in ("solver", "verifier"):
        for name in ("reward", "loss", "grad_norm", "entropy_mc", "tokens_per_s"):
            points = client.get_metric_history(rid, f"{agent}/{name}")
            assert sorted(p.step for p in points) == [0, 1, 2], (agent, name)
    team = sorted(client.get_metric_history(rid, "team/reward"), key=lambda p: p.step)
    assert [p.value for p in team] == pytest.approx(
        [r["team_reward"] for r in out["per_step"]], abs=1e-4
    )
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked-run"
    assert run.data.params["meg.run.mode"] == out["mode"]
    final = {a.path for a in client.list_artifacts(rid, "final")}
    assert final == {"final/solver", "final/verifier"}
    assert any(a.path.endswith(".safetensors") for a in client.list_artifacts(rid, "final/solver"))

    page = render(
        f"{mlflow_server.url}/#/experiments/{exp.experiment_id}/runs/{rid}", tmp_path / "chromium"
    )
    for shown in ("tracked-run", "Finished", "solver/reward", "verifier/loss", "team/reward"):
        assert shown in page, shown


def demo(client: MlflowClient) -> str:
    exp = client.get_experiment_by_name("demo")
    assert exp is not None
    return str(exp.experiment_id)


def test_a_tracking_server_that_goes_away_costs_metrics_not_the_run(
    tmp_path: Path,
    mlflow_server: MLflowServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast once it is gone
    direct = MlflowClient(tracking_uri=f"sqlite:///{mlflow_server.db}")  # the server's own store
    later = [
        dataclasses.replace(r, step=4, timing=dataclasses.replace(r.timing, step=4)) for r in REFS
    ]
    with tracking.tracking(("mlflow",), tmp_path / "run", "demo-1", "demo", 2, {"a": 1}) as t:
        t.start(0.0)
        for ref in REFS:  # step 3
            t("event", ref)
        end = time.time() + 60
        while not direct.search_runs([demo(direct)])[0].data.metrics.get("solver/reward"):
            assert time.time() < end, "step 3 never reached the server"
            time.sleep(0.2)
        mlflow_server.stop()
        for ref in later:  # step 4: nobody answers
            t("event", ref)
    out = capsys.readouterr().out
    assert "mlflow: not logged (the metrics of step 4:" in out
    [run] = direct.search_runs([demo(direct)])
    page = f"{mlflow_server.url}/#/experiments/{demo(direct)}/runs/{run.info.run_id}"
    assert f"mlflow: run 'run' at {page}" in out  # where to look, said when it opened
    assert [p.step for p in direct.get_metric_history(run.info.run_id, "solver/reward")] == [3]
    assert run.info.status == "RUNNING"  # its end could not be told either


def test_a_run_that_raises_ends_its_wandb_run_with_exit_code_1(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="the run broke"),
        tracking.tracking(("wandb",), tmp_path / "run", "demo-1", "demo", 2, {"a": 1}) as t,
    ):
        t.start(0.0)
        for ref in REFS:
            t("event", ref)
        raise RuntimeError("the run broke")
    records = wandb_records(tmp_path / "run")
    [end] = records["exit"]
    assert end.exit.exit_code == 1
    assert len(records["history"]) == 1  # the step logged before it broke is kept
