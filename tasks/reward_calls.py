"""Reward calls with a timeout each, run in a pool of reward processes.

A reward function that raises, returns garbage or hangs must cost one sample, not the run
(a run of days meets such code). Each worker keeps a small pool of reward processes
(`tasks.reward_child`, plain `subprocess` children: Dask worker processes are daemonic and
may not start `multiprocessing` children). A job is one episode's calls; the child answers
call by call, and each answer must arrive within the call's timeout. When one does not, the
process is killed (its whole process group: a reward may have started children of its
own), the call is marked failed, and the rest of the episode goes to a fresh process.

Episodes are spread over the pool's processes by threads, so scoring a micro-batch is not
serialised on one process. A process that exits mid-call (an `os._exit`, the kernel's
OOM killer) fails that call the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

START_TIMEOUT_S = 120.0  # importing the reward modules (sympy for math-verify) on a busy host


class RewardProcessError(RuntimeError):
    """A reward process could not start (a plug-in that does not import there)."""


@dataclass(frozen=True, slots=True)
class Call:
    sample_id: str
    fn: str
    params: dict[str, Any]
    timeout_s: float
    kind: str = "reward"  # or "tool": a tool node's body (`workloads.tools`)


@dataclass(frozen=True, slots=True)
class Job:
    """One episode's reward calls, with what the reward functions see of the episode."""

    task: dict[str, str]  # TaskItem fields
    samples: dict[str, dict[str, Any]]  # sample id → {"node", "text", "parents"}
    calls: tuple[Call, ...]

    def rest(self, start: int) -> Job:
        return Job(self.task, self.samples, self.calls[start:])

    def line(self) -> bytes:
        calls = [
            {"sid": c.sample_id, "fn": c.fn, "params": c.params, "kind": c.kind} for c in self.calls
        ]
        doc = {"task": self.task, "samples": self.samples, "calls": calls}
        return (json.dumps(doc, default=str) + "\n").encode()


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's reward, or why it failed (`reward` is then NaN); a tool call's result as
    `ToolResult.to_json` wrote it (`tool`)."""

    reward: float
    error: str | None = None
    tool: dict[str, Any] | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


class _Lines:
    """Lines from a pipe, each awaited with a timeout (select on the raw descriptor)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def read(self, timeout: float) -> bytes | None:
        """The next line; None on timeout; EOFError when the writer is gone."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class RewardProcess:
    """One `tasks.reward_child` process (its own process group), started and handshaken."""

    def __init__(self, plugins: Sequence[str], rewards: Sequence[str] = ()) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tasks.reward_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.lines = self.proc.stdin, _Lines(self.proc.stdout.fileno())
        init = {"plugins": list(plugins), "rewards": list(rewards)}
        self._send(json.dumps(init).encode() + b"\n")
        try:
            answer = self.lines.read(START_TIMEOUT_S)
        except EOFError:
            answer = None
        if answer is None or "ready" not in (doc := json.loads(answer)):
            why = "did not start" if answer is None else doc.get("fatal")
            self.kill()
            raise RewardProcessError(f"the reward process failed to start: {why}")

    def _send(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def run(self, job: Job) -> list[Outcome]:
        """The outcomes of `job`'s calls, in order, up to and including the first one that
        timed out or killed the process (after which this process is dead)."""
        self._send(job.line())
        out: list[Outcome] = []
        for call in job.calls:
            try:
                line = self.lines.read(call.timeout_s)
            except EOFError:
                code = self.proc.wait()
                out.append(Outcome(float("nan"), f"the reward process died (exit code {code})"))
                return out
            if line is None:
                self.kill()
                out.append(Outcome(float("nan"), f"timed out after {call.timeout_s:g} s"))
                return out
            doc = json.loads(line)
            out.append(Outcome(float(doc.get("reward", "nan")), doc.get("error"), doc.get("tool")))
        return out

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group (a reward's own children too) and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class RewardPool:
    """`size` reward processes for one set of plug-ins, started on first use; `rewards`: the
    names the run binds (their warm-ups run when a process starts)."""

    def __init__(self, plugins: Sequence[str], size: int, rewards: Sequence[str] = ()) -> None:
        self.plugins, self.size, self.rewards = tuple(plugins), size, tuple(sorted(rewards))
        self._idle: queue.LifoQueue[RewardProcess] = queue.LifoQueue()
        self._all: list[RewardProcess] = []
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="reward")
        self.restarts = 0  # processes killed for a timeout or found dead

    def _take(self) -> RewardProcess:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            p = RewardProcess(self.plugins, self.rewards)
            with self._lock:
                self._all.append(p)
            return p

    def _give_back(self, p: RewardProcess) -> None:
        if p.alive:
            self._idle.put(p)
            return
        p.kill()  # reap; drop it
        with self._lock:
            self._all.remove(p)
            self.restarts += 1

    def _run_job(self, job: Job) -> list[Outcome]:
        out: list[Outcome] = []
        while len(out) < len(job.calls):
            p = self._take()
            try:
                out += p.run(job.rest(len(out)))
            finally:
                self._give_back(p)
        return out

    def run(self, jobs: Sequence[Job]) -> list[list[Outcome]]:
        """Every job's outcomes (jobs run concurrently, one process each)."""
        return list(self._threads.map(self._run_job, jobs))

    def close(self) -> None:
        with self._lock:
            procs, self._all = self._all, []
        for p in procs:
            p.kill()
        self._threads.shutdown(wait=False)


_POOLS: dict[tuple[tuple[str, ...], int, tuple[str, ...]], RewardPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(plugins: Sequence[str], size: int, rewards: Sequence[str] = ()) -> RewardPool:
    """This process's pool for these plug-ins and bound rewards (one per worker process,
    reused by every score task of the run)."""
    key = (tuple(plugins), size, tuple(sorted(rewards)))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = RewardPool(*key)
        return _POOLS[key]


@atexit.register
def close_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for p in pools:
        p.close()
