"""`flexmarl ui`: the Prefect server with its UI on 127.0.0.1, on any port, stopped with us.

Two things `prefect server start --port N` alone gets wrong for us (both seen in headless
Chromium):

- the UI asks its settings for the API address, and that setting (`server.ui.api_url`)
  follows `PREFECT_API_URL` or the *configured* API port (4200), not the `--port` flag: on
  any other port the page loads and then shows "Can't connect to Server API". So the child
  gets `PREFECT_SERVER_API_HOST/PORT` and `PREFECT_UI_API_URL` for the port it serves on.
- `subprocess.call` leaves the server running when `flexmarl ui` itself is stopped with
  SIGTERM (only Ctrl-C reaches the child through the terminal). The server runs in its own
  process group, and SIGTERM, SIGINT and SIGHUP stop that whole group (uvicorn and its
  workers; SIGKILL after a grace period), then we exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def server_env(port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a Prefect server serving API and UI on 127.0.0.1:`port`."""
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no network here
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            "PREFECT_SERVER_API_PORT": str(port),
            "PREFECT_UI_API_URL": api,
            "PREFECT_API_URL": api,
        }
    )
    return env


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def serve(port: int, grace_s: float = 15.0) -> int:
    """Run the server until it exits or we are told to stop; returns its exit code (or
    128 + the signal that stopped us). The signal handler only sends SIGTERM to the server's
    group; this loop reaps it, and SIGKILLs it after `grace_s` (waiting inside a handler
    would deadlock on the `Popen.wait` it interrupted)."""
    cmd = [sys.executable, "-m", "prefect", "server", "start"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=server_env(port), start_new_session=True)
    stopped: list[tuple[int, float]] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopped:
            stopped.append((signum, time.monotonic()))
            _signal_group(proc, signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        while proc.poll() is None:
            if stopped and time.monotonic() - stopped[0][1] > grace_s:
                _signal_group(proc, signal.SIGKILL)
            time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:  # leaving for another reason (an error): take it along
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    return 128 + stopped[0][0] if stopped else int(proc.returncode)
