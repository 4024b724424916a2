"""The MLflow tracker on its default store (a SQLite file in the run dir), read back with
MLflow's own client: metrics per step, params, the config artifact, the run's status; a
resumed run continuing the same MLflow run; an unreachable server refused before the run
starts. (A real `mlflow server` is in tests/flows/test_tracking_run.py.)"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from flows.report import tracking
from flows.report.trackers import SQLALCHEMY_NOISE, Sender, TrackingError
from tests.flows.report.test_tracking import REFS

pytestmark = [  # what the tracker silences in a run (SQLALCHEMY_NOISE), read back here too
    pytest.mark.filterwarnings(f"ignore:{message}") for message in SQLALCHEMY_NOISE
]
PARAMS = {"meg": {"run": {"mode": "flex", "steps": 3}}, "cluster": {"train_workers": 1}}


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


def local(run_dir: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow' / 'mlflow.db'}")


def only_run(client: MlflowClient, experiment: str) -> Any:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    [run] = client.search_runs([exp.experiment_id])
    return run


def log_run(run_dir: Path, params: dict[str, Any], fail: bool = False) -> None:
    with tracking.tracking(("mlflow",), run_dir, "demo-1", "demo", 2, params) as t:
        t.start(0.0)
        for ref in REFS:
            t("event", ref)
        if fail:
            raise RuntimeError("the run broke")


def test_mlflow_logs_to_the_run_dirs_own_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_run(tmp_path / "run", PARAMS)
    store = f"sqlite:///{tmp_path.resolve() / 'run' / 'mlflow' / 'mlflow.db'}"
    opened = f"mlflow: run 'run' in {store} (to look at it: python -m mlflow ui --backend-store-uri {store})"
    assert opened in capsys.readouterr().out
    client = local(tmp_path / "run")
    run = only_run(client, "demo")  # the experiment is the MEG's name
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.tags["flexmarl.run_id"] == "demo-1"
    [point] = client.get_metric_history(run.info.run_id, "solver/tokens_per_s")
    assert point.step == 3 and point.value == pytest.approx(25.0)
    assert {"solver/reward", "verifier/kl", "team/reward", "step/wall_s"} <= set(run.data.metrics)
    assert run.data.params["meg.run.mode"] == "flex"
    assert run.data.params["cluster.train_workers"] == "1"
    [config] = client.list_artifacts(run.info.run_id, "config")
    assert config.path == "config/run.json"


def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path) -> None:
    log_run(tmp_path / "run", PARAMS)
    longer = {**PARAMS, "meg": {"run": {"mode": "flex", "steps": 6}}}
    log_run(tmp_path / "run", longer)
    run = only_run(local(tmp_path / "run"), "demo")  # one MLflow run, not two
    assert run.data.params["meg.run.steps"] == "3"  # MLflow params never change...
    assert run.data.tags["resumed.meg.run.steps"] == "6"  # ...the new value is a tag
    assert run.info.status == "FINISHED"


def test_a_run_that_raises_is_marked_failed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the run broke"):
        log_run(tmp_path / "run", PARAMS, fail=True)
    run = only_run(local(tmp_path / "run"), "demo")
    assert run.info.status == "FAILED"
    assert "solver/reward" in run.data.metrics  # what was logged before is kept


def test_an_unreachable_server_stops_the_run_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(TrackingError, match=rf"tracking server http://127\.0\.0\.1:{port}"):
        log_run(tmp_path / "run", PARAMS)


def test_the_sender_batches_metrics_and_keeps_the_order() -> None:
    from mlflow.entities import Metric

    log: list[Any] = []
    sender = Sender("test", lambda batch: log.append(sorted({m.step for m in batch})), every=60)
    for step in (1, 2, 3):
        sender.metrics([Metric("a/reward", 0.5, 0, step), Metric("a/loss", 1.0, 0, step)])
    sender.put("the end", log.append, "end")  # sends the held metrics first, in one batch
    sender.close()
    assert log == [[1, 2, 3], "end"]


def test_the_sender_drops_what_follows_a_refused_call(capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.entities import Metric

    log: list[str] = []

    def refuse(batch: list[Any]) -> None:
        raise ConnectionError("connection refused\nretries exhausted")

    sender = Sender("test", refuse, every=60)
    sender.metrics([Metric("a/reward", 0.5, 0, 7)])
    sender.put("the end", log.append, "end")
    sender.close()
    assert log == []  # nothing after the refused call
    out = capsys.readouterr().out
    assert "test: not logged (the metrics of step 7: connection refused)" in out
