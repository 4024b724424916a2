"""Run untrusted Python source — model output — in a confined child process.

A reward that executes what a model wrote runs code nobody has read, thousands of times a
step, for days, inside a worker that holds the run's store, checkpoints and credentials. So
every execution gets a fresh process that cannot see or touch any of that, and whatever it
does (loop, allocate, fork, write, connect, kill) costs one sample, never the run:

- a separate process per execution, started with `subprocess` (Dask worker processes are
  daemonic: they may not have `multiprocessing` children), in a session of its own;
- namespaces where the machine allows them (mode `namespaces` as root, `userns` without
  root): no network (a fresh network namespace has only a down loopback), a PID namespace
  (the code cannot see or signal anything outside it, and its PID 1 exiting kills every
  process it left), and a private, read-only root that holds the interpreter's directories
  and a size-capped tmpfs work directory — nothing else of the machine's files (no store,
  no checkpoints, no home directory, no /tmp);
- an unprivileged uid of its own (NPROC is not enforced for root, and a different uid
  cannot signal or ptrace the worker), no supplementary groups, PR_SET_NO_NEW_PRIVS;
- rlimits set in the child before `execve`: CPU, address space, file size, processes,
  open files, no core dumps, no locked memory;
- `python -I -S -B` (isolated: no environment variables, no site-packages, no user site)
  with a minimal environment (no inherited variables, such as credentials) and stdin closed;
- a wall-clock timeout after which the whole process group is SIGKILLed;
- an audit hook (`guard=True`, the default) that stops forbidden actions at once and names
  them — defence in depth and a clear reason; the confinement above does not rely on it.

Where namespaces cannot be made (a container without the capability, user namespaces
switched off), the sandbox falls back to `uid` (root: its own uid, no namespaces) or
`rlimits` (neither), says so in a logged warning once per process, and names the mode in
force in `Sandbox.isolation`. The probe that decides runs once per process. docs/sandbox.md
has each limit, its default, and what each mode leaves open.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from workloads.sandbox_exec import (
    NAMESPACED,
    STOPPED,
    UID_BASE,
    UID_SLOTS,
    Limits,
    SandboxError,
    SandboxResult,
    SandboxUnavailable,
    Status,
    execute,
)

__all__ = [
    "MODES",
    "NAMESPACED",
    "STOPPED",
    "UID_BASE",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
    "SandboxUnavailable",
    "Status",
    "default_pool",
    "detect_isolation",
    "probe",
]

log = logging.getLogger(__name__)

# Isolation modes, strongest first; what each one enforces (docs/sandbox.md).
MODES = {
    "namespaces": "mount (private read-only root), network, PID, IPC and UTS namespaces; "
    "its own unprivileged uid; rlimits; audit hook (needs root)",
    "userns": "the same namespaces inside a user namespace (no root needed); an unprivileged "
    "uid without capabilities; rlimits; audit hook",
    "uid": "no namespaces: its own unprivileged uid, rlimits, audit hook; the network and "
    "world-readable files stay reachable (needs root)",
    "rlimits": "no namespaces and the worker's own uid: rlimits and the audit hook only",
}
_PREFERENCE = {True: ("namespaces", "userns", "uid", "rlimits"), False: ("userns", "rlimits")}

_PROBED: dict[str, str | None] = {}  # mode → None (works here) or why not
_CHOSEN: list[str] = []  # the mode detect_isolation() chose, then why the stronger ones failed
_WARNED: list[bool] = []
_LOCK = threading.RLock()


def probe(mode: str) -> str | None:
    """None when `mode` runs code on this machine, else why not (probed once per process)."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox isolation {mode!r}; known: {', '.join(MODES)}")
    with _LOCK:
        if mode not in _PROBED:
            if mode in ("namespaces", "uid") and os.geteuid() != 0:
                _PROBED[mode] = "needs root"
            else:
                try:
                    r = execute(mode, "print('ok')", {}, Limits(timeout_s=30.0), True)
                    ok = r.status == "ok" and r.stdout.strip() == "ok"
                    _PROBED[mode] = None if ok else f"{r.status}: {r.reason}"
                except SandboxError as e:
                    _PROBED[mode] = str(e)
        return _PROBED[mode]


def detect_isolation() -> str:
    """The strongest mode that works here (probed once per process, silently: the first
    `Sandbox` in a mode without namespaces logs the warning, so a reward process that only
    warms the probe up does not warn in runs that execute no code)."""
    with _LOCK:
        if _CHOSEN:
            return _CHOSEN[0]
        why: list[str] = []
        for mode in _PREFERENCE[os.geteuid() == 0]:
            reason = probe(mode)
            if reason is None:
                break
            why.append(f"{mode}: {reason}")
        else:
            raise SandboxUnavailable("no sandbox mode works here: " + "; ".join(why))
        _CHOSEN.extend([mode, "; ".join(why)])
        return mode


def _warn_once(mode: str) -> None:
    with _LOCK:
        if mode in NAMESPACED or _WARNED:
            return
        _WARNED.append(True)
        why = _CHOSEN[1] if len(_CHOSEN) > 1 else "asked for"
    log.warning(
        "sandbox: no namespaces (%s); model code runs under %r: %s. See docs/sandbox.md.",
        why,
        mode,
        MODES[mode],
    )


class Sandbox:
    """Runs source in the confinement of `isolation` (default: the strongest mode this
    machine allows, `detect_isolation()`), with `limits`. Thread-safe: executions from
    several threads run at once (`SandboxPool`)."""

    def __init__(self, limits: Limits | None = None, *, isolation: str | None = None) -> None:
        self.limits = limits or Limits()
        if isolation is None:
            isolation = detect_isolation()
        elif (why := probe(isolation)) is not None:
            raise SandboxUnavailable(f"sandbox isolation {isolation!r} does not work here: {why}")
        _warn_once(isolation)
        self.isolation = isolation

    def run(
        self,
        source: str,
        *,
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
        guard: bool = True,
    ) -> SandboxResult:
        """Execute `source` as `main.py` in an empty work directory holding `files`
        (plain names → text or bytes); `guard=False` leaves the audit hook out (the OS
        confinement alone, for tests of it)."""
        return execute(self.isolation, source, files or {}, limits or self.limits, guard)


class SandboxPool:
    """A thread pool that launches sandbox processes, so several executions run at once and
    scoring is not serialised on one child (each thread only waits on its process)."""

    def __init__(self, max_workers: int = 4, sandbox: Sandbox | None = None) -> None:
        if not 1 <= max_workers <= UID_SLOTS:
            raise ValueError(f"max_workers must be in 1..{UID_SLOTS} (got {max_workers})")
        self.sandbox = sandbox or Sandbox()
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="sandbox")

    def submit(self, source: str, **kwargs: Any) -> Future[SandboxResult]:
        return self._pool.submit(self.sandbox.run, source, **kwargs)

    def map(self, sources: Iterable[str], **kwargs: Any) -> list[SandboxResult]:
        """Run every source (at most `max_workers` at once); results in order."""
        return [f.result() for f in [self.submit(s, **kwargs) for s in sources]]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DEFAULT: list[SandboxPool] = []


def default_pool() -> SandboxPool:
    """The process's shared pool (4 threads, default limits), made on first use."""
    with _LOCK:
        if not _DEFAULT:
            _DEFAULT.append(SandboxPool(4))
        return _DEFAULT[0]
