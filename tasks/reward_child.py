"""The reward process: runs reward calls for `tasks.reward_calls`, one job at a time.

Why a process of its own: a reward function is user code, and a call that hangs (a
catastrophic regex, a stuck network call, an infinite loop in a parser) cannot be stopped
inside the worker — Python threads cannot be killed, and a C loop holding the GIL would
stall the worker's other threads too. In a process the parent can wait for each call with
a timeout and kill the process when one runs over, then start a fresh one.

Protocol (one JSON document per line; never pickle):

- parent → child, first line: `{"plugins": [...], "rewards": [...]}` (the parent's
  `sys.path` comes as `PYTHONPATH`, shipped plug-ins included); the child imports the
  plug-ins and the reward registry, warms up the rewards the run binds
  (`workloads.rewards.on_warm_up`), then answers `{"ready": true}` (or `{"fatal": "..."}`
  and exits).
- parent → child, then one line per job: `{"task": {...}, "samples": {sid: {"node",
  "text", "parents"}}, "calls": [{"sid", "fn", "params"}, ...]}` — one episode's calls.
- child → parent: one line per call, in order, as soon as it is done: `{"reward": r}` or
  `{"error": "Type: message"}` (a call of `"kind": "tool"`: `{"tool": {"text", "terminal",
  "reward", "metadata"}}`, `workloads.tools`). Streaming the answers is what lets the
  parent time each call on its own while still sending a whole episode at once.

The reward's own prints go to stderr (the worker's log): stdout carries the protocol only.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import IO, Any


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a worker killed by the OS
    must not leave reward processes behind, least of all one stuck in a loop)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent kills us at exit instead
        pass


def import_plugins(entries: list[str]) -> None:
    """Import the run's plug-ins: a local file or package by its path where it exists
    here (the driver's own process), else by module name from the shipped copy on the
    parent's `sys.path` (a Dask worker), else as an installed module."""
    if not entries:
        return  # workloads.plugins imports distributed: half a second per process start
    from workloads.plugins import import_all, module_name

    for entry in entries:
        if Path(entry).is_absolute() and Path(entry).exists():
            import_all([entry])
        else:
            __import__(module_name(entry))


def run_tool(call: dict[str, Any], views: Any, task: Any) -> dict[str, Any]:
    """One tool call → `{"tool": ToolResult.to_json()}` or `{"error": why}`."""
    from workloads.tools import ToolResult, get_tool

    try:
        fn = get_tool(call["fn"])
        result = ToolResult.of(fn(views.samples[call["sid"]], views, task, **call["params"]))
        return {"tool": result.to_json()}
    except (Exception, SystemExit) as e:  # the call failed; the process carries on
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def run_call(call: dict[str, Any], views: Any, task: Any) -> dict[str, Any]:
    """One reward call → `{"reward": r}` or `{"error": why}` (non-numbers and NaN/inf are
    errors too: they would poison the group's advantages); a tool call → `run_tool`."""
    from workloads.rewards import get_reward

    if call.get("kind") == "tool":
        return run_tool(call, views, task)

    try:
        fn = get_reward(call["fn"])
        value = fn(views.samples[call["sid"]], views, task, **call["params"])
        reward = float(value)
    except (Exception, SystemExit) as e:  # the call failed; the process carries on
        return {"error": f"{type(e).__name__}: {e}"[:500]}
    if not math.isfinite(reward):
        return {"error": f"the reward function returned {reward!r}"}
    return {"reward": reward}


def serve(lines: IO[str], out: IO[str]) -> None:
    from workloads.datasets import TaskItem
    from workloads.rewards import EpisodeView, SampleView

    for line in lines:
        job = json.loads(line)
        views = EpisodeView(
            {
                sid: SampleView(sid, s["node"], s["text"], tuple(s["parents"]))
                for sid, s in job["samples"].items()
            }
        )
        task = TaskItem(**job["task"])
        for call in job["calls"]:
            out.write(json.dumps(run_call(call, views, task)) + "\n")
            out.flush()


def main() -> None:
    die_with_parent()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the reward prints lands in the log, not in the protocol
    sys.stdout = sys.stderr
    init = json.loads(sys.stdin.readline() or "{}")
    try:
        import_plugins(init.get("plugins", []))
        from workloads.rewards import warm_up  # the built-in rewards, registered

        warm_up(init.get("rewards", []))
    except Exception as e:
        out.write(json.dumps({"fatal": f"{type(e).__name__}: {e}"}) + "\n")
        return
    out.write(json.dumps({"ready": True}) + "\n")
    serve(sys.stdin, out)


if __name__ == "__main__":
    main()
