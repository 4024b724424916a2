"""`flexmarl ui` in a real browser: any port, a short training against it, the run and its
artifacts rendered by the Prefect UI in headless Chromium, and SIGTERM stopping the server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flows.cli.main import main
from tests.flows.conftest import use_backend

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError(f"`flexmarl ui` exited with {proc.returncode}")
        try:
            get(url)
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s")


def flow_runs(base: str) -> list[dict[str, object]]:
    """The flow runs this server recorded, read from its REST API (not from console output,
    which rich wraps at the terminal width)."""
    req = urllib.request.Request(
        f"{base}/api/flow_runs/filter",
        data=json.dumps({"limit": 10}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return list(json.loads(r.read().decode()))


def render(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, as headless Chromium sees it."""
    assert CHROMIUM, "Debian's chromium is needed (apt-get install chromium; `make test` does)"
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return out.stdout


def test_ui_on_any_port_renders_a_run_and_stops_with_sigterm(
    tmp_path: Path, tiny_model: str
) -> None:
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}  # a database of its own
    env.pop("PREFECT_API_URL", None)
    ui = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "ui", "--port", str(port)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(f"{base}/api/health", ui)
        assert f'"api_url":"{base}/api"' in get(f"{base}/ui-settings")  # follows the port
        assert main(["init", str(tmp_path / "uiwork"), "--model", tiny_model]) == 0
        use_backend(tmp_path / "uiwork" / "uiwork.yaml", "hf")  # the UI is tested, not vLLM
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli",
                "train",
                str(tmp_path / "uiwork" / "uiwork.yaml"),
                "--steps",
                "2",
                "--run-dir",
                str(tmp_path / "run"),
                "--colocate",  # one worker, not the layout's three: the UI is tested here
            ],
            env={**env, "PREFECT_API_URL": f"{base}/api"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        runs = [r for r in flow_runs(base) if r.get("parent_task_run_id") is None]
        assert len(runs) == 1, f"the run did not report to this server: {runs}"
        assert runs[0]["state_type"] == "COMPLETED", runs[0]["state_type"]
        page = render(f"{base}/runs/flow-run/{runs[0]['id']}", tmp_path / "chromium")
        assert "flexmarl-train" in page and "Completed" in page
        assert "Can't connect to Server API" not in page
        keys = ("uiwork-flex-reward-curve", "uiwork-flex-timeline", "uiwork-flex-metrics")
        for _ in range(3):  # a loaded machine can leave the list unrendered in the budget
            artifacts = render(f"{base}/artifacts", tmp_path / "chromium")
            if all(key in artifacts for key in keys):
                break
        for key in keys:
            assert key in artifacts, key
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.wait(timeout=60)
    end = time.time() + 30
    while time.time() < end:  # the server went with it: nothing answers on the port
        try:
            get(f"{base}/api/health")
        except OSError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the Prefect server outlived `flexmarl ui` after SIGTERM")
    with pytest.raises(ProcessLookupError):
        os.killpg(ui.pid, 0)  # and its whole process group is gone
