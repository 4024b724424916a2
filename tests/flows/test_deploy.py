"""`prefect deploy --all` of the repo's prefect.yaml against a real server started here.

The server gets its own PREFECT_HOME (a fresh SQLite database) and port; the deployments
are then read back with the Prefect client: all three exist, the debate schedule is
inactive, the parameter schemas are the pydantic models (the UI's form), and the pull step
enters this checkout (no git, no network).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.evaluate import EvalParams
from flows.train import TrainParams

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PREFECT = (sys.executable, "-m", "prefect")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited ({proc.returncode}):\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"prefect server not healthy after {timeout} s:\n{log.read_text()}")


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """(API URL, environment for `prefect` CLI calls) of a fresh server on a free port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with its children
        )
    try:
        wait_healthy(url, proc, log, timeout=120)
        yield url, {**env, "PREFECT_API_URL": url}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def prefect(env: dict[str, str], *args: str) -> str:
    res = subprocess.run(
        [*PREFECT, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"prefect {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def test_prefect_deploy_all_creates_the_three_deployments(
    server: tuple[str, dict[str, str]],
) -> None:
    url, env = server
    prefect(env, "work-pool", "create", "flexmarl-local", "--type", "process")
    prefect(env, "--no-prompt", "deploy", "--all")

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        deps = {
            name: client.read_deployment_by_name(name)
            for name in (
                "flexmarl-train/train-math-chain",
                "flexmarl-train/train-debate",
                "flexmarl-evaluate/evaluate-math-chain",
            )
        }
    for d in deps.values():
        assert d.work_pool_name == "flexmarl-local" and d.description
        # the pull step enters this checkout: nothing is cloned or downloaded
        (step,) = d.pull_steps or []
        assert step == {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}

    assert not deps["flexmarl-train/train-math-chain"].schedules
    (sched,) = deps["flexmarl-train/train-debate"].schedules
    assert sched.active is False and getattr(sched.schedule, "cron", None) == "0 2 * * *"

    # parameters validate against the pydantic models; the schema is their form
    train = deps["flexmarl-train/train-math-chain"]
    assert TrainParams.model_validate(train.parameters["params"]).config == "math-chain"
    debate = deps["flexmarl-train/train-debate"]
    assert TrainParams.model_validate(debate.parameters["params"]).config == "debate"
    ev = deps["flexmarl-evaluate/evaluate-math-chain"]
    assert EvalParams.model_validate(ev.parameters["params"]).base is True
    for dep, model in ((train, TrainParams), (ev, EvalParams)):
        schema = dep.parameter_openapi_schema or {}
        assert schema["properties"]["params"]["$ref"].endswith(f"/{model.__name__}")
        props = schema["definitions"][model.__name__]["properties"]
        assert set(model.model_fields) <= set(props)
