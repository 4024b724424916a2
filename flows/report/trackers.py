"""The experiment trackers a run can log to (`run.tracking`), one class each behind the
`Tracker` protocol, found by name in `TRACKERS`.

- `tensorboard`: event files under `<run_dir>/tensorboard/` (`tensorboard --logdir RUN`),
  scalars named `agent/metric`, the resolved MEG and settings as text.
- `wandb`: an offline run under `<run_dir>/wandb/` (`wandb sync` uploads it later; nothing
  leaves the machine during the run), the settings as its config, final models as
  artifacts of type `model`.
- `mlflow`: a run on the tracking server `MLFLOW_TRACKING_URI` names (else a SQLite store
  under `<run_dir>/mlflow/`), in the experiment `MLFLOW_EXPERIMENT_NAME` (else the MEG's
  name); the settings as params, the full config as an artifact, final models as artifacts
  under `final/<agent>/`. A resumed run continues the same MLflow run (its id is kept in
  `<run_dir>/mlflow_runs.json`, per tracking server).

The packages are optional (`pip install -e ".[tracking]"`); naming a tracker whose package
is missing stops the run before anything starts, with the install command.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from flows.runs.record import RunError


class Tracker(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_model(self, agent: str, path: Path) -> None: ...
    def close(self, ok: bool) -> None: ...


class TrackingError(RunError):
    """A tracker cannot start (its package is missing): the run stops before its cluster
    starts, reported as a user error."""


def _require(module: str, tracker: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(
            f"run.tracking names {tracker!r}, but {module!r} is not installed: "
            f'pip install -e ".[tracking]" (or drop {tracker!r} from run.tracking)'
        ) from None


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"run": {"mode": "flex"}} → {"run.mode": "flex"}; lists as JSON text."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list | tuple) else v
    return out


class TensorBoardTracker:
    def __init__(self, run_dir: Path, run_id: str, name: str) -> None:
        tb = _require("torch.utils.tensorboard", "tensorboard")
        self.writer = tb.SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log_params(self, params: dict[str, Any]) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(params, indent=2)}\n```", 0)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_model(self, agent: str, path: Path) -> None:
        self.writer.add_text(f"final/{agent}", str(path), 0)

    def close(self, ok: bool) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, run_id: str, name: str) -> None:
        self.wandb = _require("wandb", "wandb")
        self.run = self.wandb.init(
            mode="offline",
            dir=str(run_dir),
            project=name,
            id=run_id.replace("/", "-"),
            resume="allow",  # a resumed run goes on in the same wandb run
            settings=self.wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(flatten(params), allow_val_change=True)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_model(self, agent: str, path: Path) -> None:
        art = self.wandb.Artifact(f"{agent}-final", type="model")
        art.add_dir(str(path))
        self.run.log_artifact(art)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


RUN_TAG = "flexmarl.run_id"  # the flexmarl run an MLflow run records
PARAM_VALUE_MAX = 6000  # MLflow's longest param value; the whole config is an artifact too
PARAMS_PER_CALL = 100  # MLflow's limit on params in one log_batch
MAX_PENDING = 32  # calls waiting for the server before the driver waits
METRICS_EVERY_S = 2.0  # metrics are sent at most this often (`Sender`)
METRICS_PER_CALL = 1000  # MLflow's limit on metrics in one log_batch
FLUSH = ("flush", None, ())  # the Sender's own marker: `every` is up


SQLALCHEMY_NOISE = (
    # MLflow 3.17's SQLAlchemy store asks for a loader that SQLAlchemy 2.1 deprecated
    "The ``noload`` loader strategy is deprecated",
    # configuring MLflow's mappers configures every mapper in the process, Prefect's server
    # models too where they are imported (its UUID column type predates SQLAlchemy 2.1)
    "Type object .* does not refer to an OperatorClass",
)


def quiet_sqlalchemy() -> None:
    """Silence SQLAlchemy's deprecation notices about MLflow's and Prefect's models in this
    process: nothing a user of either can act on, repeated on every query."""
    for message in SQLALCHEMY_NOISE:
        warnings.filterwarnings("ignore", message)


class MLflowTracker:
    """MLflow through its client (`MlflowClient`), not the fluent API: the fluent API keeps
    one active run per process, and the driver may run several flows at once.

    Everything after the run's creation is sent by a `Sender` thread, in order; `close`
    waits for it after it marks the run FINISHED (or FAILED)."""

    def __init__(self, run_dir: Path, run_id: str, name: str) -> None:
        _require("mlflow", "mlflow")
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        uri, artifacts = os.environ.get("MLFLOW_TRACKING_URI"), None
        if not uri:  # like wandb offline: the run's own store, `mlflow ui` opens it later
            quiet_sqlalchemy()
            local = (run_dir / "mlflow").resolve()
            local.mkdir(parents=True, exist_ok=True)
            uri, artifacts = f"sqlite:///{local / 'mlflow.db'}", (local / "artifacts").as_uri()
        self.client, self.uri = MlflowClient(tracking_uri=uri), uri
        self.ids = run_dir / "mlflow_runs.json"
        self.params: dict[str, str] = {}
        try:
            self._start(
                run_dir, run_id, os.environ.get("MLFLOW_EXPERIMENT_NAME") or name, artifacts
            )
        except MlflowException as e:  # unreachable server, refused credentials, bad URI
            raise TrackingError(
                f"run.tracking names 'mlflow', but its tracking server {uri} refused or did "
                f"not answer (MLFLOW_TRACKING_URI): {str(e).splitlines()[0][:300]}"
            ) from None
        self.sender = Sender("mlflow", self._log_metrics, METRICS_EVERY_S)
        print(f"mlflow: {self.where()}")

    def where(self) -> str:
        """Where to look at the run: its page on a server, or the command that opens the
        run's own store."""
        if self.uri.startswith(("http://", "https://")):
            page = f"{self.uri.rstrip('/')}/#/experiments/{self.experiment}/runs/{self.run_id}"
            return f"run {self.run_name!r} at {page}"
        ui = f"python -m mlflow ui --backend-store-uri {self.uri}"
        return f"run {self.run_name!r} in {self.uri} (to look at it: {ui})"

    def _start(self, run_dir: Path, run_id: str, experiment: str, artifacts: str | None) -> None:
        """Continue the MLflow run this run dir logged to on this server (`mlflow_runs.json`:
        tracking URI → MLflow run id), or create one."""
        known = json.loads(self.ids.read_text()) if self.ids.exists() else {}
        run = self._existing(known.get(self.uri))
        if run is not None:
            self.params = dict(run.data.params)
            self.client.update_run(run.info.run_id, status="RUNNING")
        else:
            tags = {RUN_TAG: run_id, "flexmarl.run_dir": str(run_dir.resolve())}
            eid = self._experiment(experiment, artifacts)
            run = self.client.create_run(eid, run_name=run_dir.name, tags=tags)
        self.run_id, self.run_name = run.info.run_id, run.info.run_name
        self.experiment = run.info.experiment_id
        if known.get(self.uri) == self.run_id:
            return
        self.ids.parent.mkdir(parents=True, exist_ok=True)
        self.ids.write_text(json.dumps({**known, self.uri: self.run_id}, indent=1))

    def _existing(self, mlflow_id: str | None) -> Any:
        """The MLflow run `mlflow_id`, or None when the server has no such run (another
        store behind the same URI)."""
        from mlflow.exceptions import MlflowException

        if mlflow_id is None:
            return None
        try:
            return self.client.get_run(mlflow_id)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            return None

    def _experiment(self, name: str, artifacts: str | None) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(self.client.create_experiment(name, artifact_location=artifacts))
        except MlflowException:  # another run created it first
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def log_params(self, params: dict[str, Any]) -> None:
        """Params are immutable in MLflow: a resumed run logs the ones it has not logged, and
        a value that changed (a larger `run.steps`) as the tag `resumed.<key>`."""
        from mlflow.entities import Param, RunTag

        flat = {k: str(v)[:PARAM_VALUE_MAX] for k, v in flatten(params).items()}
        new = [Param(k, v) for k, v in flat.items() if k not in self.params]
        changed = [RunTag(f"resumed.{k}", v) for k, v in flat.items() if self.params.get(k, v) != v]
        for i in range(0, max(len(new), 1), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=new[i : i + PARAMS_PER_CALL], tags=changed)
            changed = []
        self.params.update(flat)
        self.client.log_text(self.run_id, json.dumps(params, indent=2), "config/run.json")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.sender.metrics([Metric(k, float(v), now, step) for k, v in metrics.items()])

    def _log_metrics(self, batch: list[Any]) -> None:
        self.client.log_batch(self.run_id, metrics=batch)

    def log_model(self, agent: str, path: Path) -> None:
        args = (self.run_id, str(path), f"final/{agent}")
        self.sender.put(f"final/{agent}", self.client.log_artifacts, *args)

    def close(self, ok: bool) -> None:
        self.sender.put("the run's end", self.client.set_terminated, self.run_id,
                        "FINISHED" if ok else "FAILED")  # fmt: skip
        self.sender.close()


class Sender:
    """Calls to a tracking server, made in order on a thread of their own, so that a slow
    server does not land on the driver's loop; at most `MAX_PENDING` wait (then the driver
    waits: a stalled server never grows the driver's memory).

    Metrics are held up to `every` seconds and sent as one batch (`send_metrics`): a call
    to a local SQLite store costs ~5 ms of CPU whether it carries one step or ten, and on a
    small machine those milliseconds are taken from the workers. Any other call sends the
    held metrics first, so the order of everything is kept.

    A call the server refuses (after the client's own retries) is reported once, and the
    calls after it are dropped: a server that is down would otherwise cost every later call
    its retries. It never fails the training run it describes; the run's own records are on
    disk either way."""

    def __init__(self, name: str, send_metrics: Callable[[list[Any]], None], every: float) -> None:
        self.name, self.send_metrics, self.every = name, send_metrics, every
        self.failed: str | None = None  # the first call the server refused
        # a call (what, function, args), a metrics batch (a list), or None: the end
        self.calls: queue.Queue[Any] = queue.Queue(MAX_PENDING)
        self.held: list[Any] = []
        self.thread = threading.Thread(target=self._run, name=f"{name}-sender", daemon=True)
        self.thread.start()

    def put(self, what: str, call: Any, *args: Any) -> None:
        self.calls.put((what, call, args))

    def metrics(self, batch: list[Any]) -> None:
        self.calls.put(batch)

    def _run(self) -> None:
        due = time.monotonic() + self.every
        while True:
            try:
                item = self.calls.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:  # `every` is up: send what is held
                item = FLUSH
            if isinstance(item, list):
                self.held.extend(item)
                continue
            self._send_held()
            due = time.monotonic() + self.every
            if item is None:
                return
            if item is not FLUSH:
                self._call(*item)

    def _send_held(self) -> None:
        held, self.held = self.held, []
        for i in range(0, len(held), METRICS_PER_CALL):
            part = held[i : i + METRICS_PER_CALL]
            steps = sorted({m.step for m in part})
            span = f" to {steps[-1]}" if len(steps) > 1 else ""
            self._call(f"the metrics of step {steps[0]}{span}", self.send_metrics, (part,))

    def _call(self, what: str, call: Any, args: tuple[Any, ...]) -> None:
        if self.failed is not None:
            return
        try:
            call(*args)
        except Exception as e:  # MlflowException, or the HTTP client's own error
            self.failed = f"{what}: {str(e).splitlines()[0][:300]}"
            print(f"{self.name}: not logged ({self.failed}); nothing more is sent to it")

    def close(self) -> None:
        self.calls.put(None)
        self.thread.join()


TRACKERS: dict[str, type] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MLflowTracker,
}
