"""The parent side of one sandbox execution: stage the files, start the launcher
(`workloads.sandbox_child`), read its pipes within the deadline, kill its process group,
classify what happened, clean up. The API and the why are in `workloads.sandbox`."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from workloads import sandbox_child, sandbox_prelude

Status = Literal["ok", "error", "timeout", "limit", "forbidden"]
STOPPED: frozenset[str] = frozenset({"timeout", "limit", "forbidden"})

NAMESPACED = frozenset({"namespaces", "userns"})

UID_BASE = 2_000_000_000  # per-execution uids: UID_BASE + (pid % 4096) * 64 + slot
UID_SLOTS = 64  # concurrent executions per process (distinct uids: NPROC counts per uid)
_CHILD = os.path.abspath(sandbox_child.__file__)
_PRELUDE = os.path.abspath(sandbox_prelude.__file__)
_BOOT_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


class SandboxError(RuntimeError):
    """An execution the sandbox had to stop (timeout, a limit, a forbidden action), raised
    by a reward so the scoring framework marks the sample failed with this reason."""

    def __init__(self, reason: str, result: SandboxResult | None = None) -> None:
        super().__init__(reason)
        self.result = result


class SandboxUnavailable(SandboxError):
    """The sandbox itself could not run the code (not the code's fault)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one execution may use (defaults sized for small function tasks)."""

    timeout_s: float = 3.0  # wall clock, then SIGKILL of the process group
    cpu_s: int = 2  # RLIMIT_CPU soft (SIGXCPU); hard = soft + 1 (SIGKILL)
    memory_mb: int = 512  # RLIMIT_AS: address space (the interpreter alone needs ~30 MiB)
    file_mb: int = 1  # RLIMIT_FSIZE: largest file it may write (Python sees EFBIG)
    processes: int = 8  # RLIMIT_NPROC: processes and threads of its uid
    open_files: int = 64  # RLIMIT_NOFILE
    workdir_mb: int = 16  # size of its tmpfs work directory (namespace modes)
    output_bytes: int = 64 * 1024  # stdout and stderr kept, each (the rest is read, dropped)

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(
                    f"sandbox limit {f.name} must be > 0 (got {getattr(self, f.name)})"
                )


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """One execution: `status` ok (exit 0) / error (it failed on its own: an exception,
    a non-zero exit) / timeout / limit (killed by a resource limit or a signal) /
    forbidden (the audit hook stopped it); `reason` says why in one line."""

    status: Status
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    reason: str
    isolation: str
    uid: int | None  # the unprivileged uid it ran as (outside any user namespace)
    cpu_s: float | None
    truncated: bool  # stdout or stderr was longer than `Limits.output_bytes`

    @property
    def stopped(self) -> bool:
        """The sandbox had to stop it: a reward must raise, not score it."""
        return self.status in STOPPED

    def raise_if_stopped(self, what: str = "sandboxed code") -> SandboxResult:
        if self.stopped:
            raise SandboxError(f"{what}: {self.reason}", self)
        return self


class _Uids:
    """Distinct uids for concurrent executions of this process (see `UID_BASE`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._used: set[int] = set()

    def acquire(self) -> int:
        with self._cond:
            self._cond.wait_for(lambda: len(self._used) < UID_SLOTS)
            slot = min(set(range(UID_SLOTS)) - self._used)
            self._used.add(slot)
        return UID_BASE + (os.getpid() % 4096) * UID_SLOTS + slot

    def release(self, uid: int) -> None:
        with self._cond:
            self._used.discard((uid - UID_BASE) % UID_SLOTS)
            self._cond.notify()


_UIDS = _Uids()


def _python() -> str:
    """The base interpreter (a venv's python is a symlink into it; -I -S needs only it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _layout() -> dict[str, Any]:
    """What the private root holds: top-level symlinks, read-only binds, device nodes."""
    links: list[tuple[str, str]] = []
    binds: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            binds.append(top)
    for path in (os.path.realpath(sys.base_prefix), os.path.dirname(_python())):
        if path != "/" and not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    binds += [p for p in ("/etc/ld.so.cache",) if os.path.isfile(p)]
    devices = [d for d in ("/dev/null", "/dev/zero", "/dev/urandom") if os.path.exists(d)]
    return {"links": links, "binds": binds, "devices": devices}


def _check_files(files: Mapping[str, str | bytes]) -> None:
    for name, data in files.items():
        if not name or "/" in name or name in (".", "..", "main.py") or "\0" in name:
            raise ValueError(f"sandbox file name {name!r}: a plain name other than main.py")
        if not isinstance(data, str | bytes):
            raise TypeError(f"sandbox file {name!r} is {type(data).__name__}, not str/bytes")


class _Streams:
    """Read the execution's four pipes until they close or the deadline passes, keeping at
    most `cap` bytes of each (a flood is read and dropped, never held)."""

    def __init__(self, fds: dict[str, int], caps: dict[str, int]) -> None:
        self.sel = selectors.DefaultSelector()
        self.fd_name = {fd: name for name, fd in fds.items()}
        self.data = {name: bytearray() for name in fds}
        self.caps, self.dropped = caps, 0
        for fd in fds.values():
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)

    def pump(self, deadline: float, until_ctl: bool = False) -> bool:
        """Read until every pipe closed (True), `ctl` closed if `until_ctl`, or the
        deadline (False)."""
        while self.fd_name:
            if until_ctl and "ctl" not in self.fd_name.values():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in self.sel.select(left):
                fd = int(key.fd)
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                name = self.fd_name[fd]
                if not chunk:
                    self.sel.unregister(fd)
                    del self.fd_name[fd]
                    continue
                keep = max(0, self.caps[name] - len(self.data[name]))
                self.data[name] += chunk[:keep]
                self.dropped += len(chunk) - len(chunk[:keep]) if name in ("out", "err") else 0
        return True

    def close(self) -> None:
        self.sel.close()

    def text(self, name: str) -> str:
        return self.data[name].decode("utf-8", "replace")

    def docs(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.text(name).splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out


_LIMIT_REASONS = {
    "memory": "memory limit: {1.memory_mb} MiB of address space (RLIMIT_AS)",
    "file size": "file size limit: {1.file_mb} MiB (RLIMIT_FSIZE)",
    "processes": "process limit: {1.processes} processes and threads (RLIMIT_NPROC)",
    "open files": "open files limit: {1.open_files} (RLIMIT_NOFILE)",
}


def _classify(
    streams: _Streams, timed_out: bool, limits: Limits, mode: str
) -> tuple[Status, str, dict[str, Any]]:
    ctl = next(iter(streams.docs("ctl")), {})
    events = streams.docs("events")
    if "setup_error" in ctl:
        raise SandboxUnavailable(f"sandbox ({mode}) could not start the code: {ctl['setup_error']}")
    forbidden = next((e["forbidden"] for e in events if "forbidden" in e), None)
    if forbidden is not None:
        return "forbidden", f"forbidden action: {forbidden}", ctl
    limit = next((str(e["limit"]) for e in events if "limit" in e), None)
    if limit is not None:
        return "limit", _LIMIT_REASONS.get(limit, "{}").format(limit, limits), ctl
    if timed_out:
        return "timeout", f"wall-clock timeout after {limits.timeout_s:g} s", ctl
    if not ctl:
        tail = streams.text("err").strip().splitlines()[-3:]
        raise SandboxUnavailable(f"the sandbox launcher ({mode}) died: {' | '.join(tail)}")
    if "signal" in ctl:
        sig = int(ctl["signal"])
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and ctl["cpu_s"] >= limits.cpu_s):
            return "limit", f"CPU limit: {limits.cpu_s} s (RLIMIT_CPU)", ctl
        if sig == signal.SIGXFSZ:
            return "limit", f"file size limit: {limits.file_mb} MiB (RLIMIT_FSIZE)", ctl
        return "limit", f"killed by {name}", ctl
    if ctl.get("exit") == 0:
        return "ok", "", ctl
    last = [ln for ln in streams.text("err").splitlines() if ln.strip()][-1:]
    return "error", (last[0].strip() if last else f"exit code {ctl.get('exit')}")[:300], ctl


def execute(
    mode: str, source: str, files: Mapping[str, str | bytes], limits: Limits, guard: bool
) -> SandboxResult:
    if not isinstance(source, str):
        raise TypeError(f"sandbox source is {type(source).__name__}, not str")
    _check_files(files)
    root = os.geteuid() == 0
    uid = _UIDS.acquire() if root and mode != "rlimits" else None
    tmp = tempfile.mkdtemp(prefix="flexmarl-sandbox-")
    ctl_r = ev_r = -1
    streams: _Streams | None = None
    proc: subprocess.Popen[bytes] | None = None
    try:
        os.chmod(tmp, 0o711)  # the `uid` mode's untrusted uid must reach tmp/work
        stage = os.path.join(tmp, "stage")
        for d in ("stage", "root", "work"):
            os.mkdir(os.path.join(tmp, d), 0o700)
        for name, data in {"main.py": source, **files}.items():
            with open(os.path.join(stage, name), "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        work = "/work" if mode in NAMESPACED else os.path.join(tmp, "work")
        cfg = {
            "mode": mode,
            "dir": tmp,
            "uid": uid if uid is not None else (os.getuid() if mode == "userns" else None),
            "guard": guard,
            "python": _python(),
            "prelude": _PRELUDE,
            "limits": asdict(limits),
            "env": {**_BOOT_ENV, "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work},
            "ctl_fd": ctl_w,
            "events_fd": ev_w,
            **_layout(),
        }
        try:
            proc = subprocess.Popen(
                [_python(), "-I", "-S", "-B", _CHILD, "boot", json.dumps(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_BOOT_ENV,
                cwd=tmp,
                start_new_session=True,
                pass_fds=(ctl_w, ev_w),
            )
        finally:
            os.close(ctl_w)
            os.close(ev_w)
        assert proc.stdout is not None and proc.stderr is not None
        fds = {"out": proc.stdout.fileno(), "err": proc.stderr.fileno(), "ctl": ctl_r}
        fds["events"] = ev_r
        cap = limits.output_bytes
        streams = _Streams(fds, {"out": cap, "err": cap, "ctl": 4096, "events": 4096})
        deadline = time.monotonic() + limits.timeout_s
        # init closes `ctl` when it has reported; then give the pipes a moment to close
        done = streams.pump(deadline, until_ctl=True)
        timed_out = not done
        if done:
            streams.pump(min(deadline, time.monotonic() + 0.5))
        _kill(proc)
        if timed_out:
            streams.pump(time.monotonic() + 0.2)
            if mode == "uid":
                sandbox_child.kill_uid(uid)  # no PID namespace: no init left to do it
        status, reason, ctl = _classify(streams, timed_out, limits, mode)
        return SandboxResult(
            status=status,
            exit_code=ctl.get("exit"),
            signal=ctl.get("signal"),
            stdout=streams.text("out"),
            stderr=streams.text("err"),
            reason=reason,
            isolation=mode,
            uid=uid,
            cpu_s=ctl.get("cpu_s"),
            truncated=streams.dropped > 0,
        )
    finally:
        if proc is not None:
            _kill(proc)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if streams is not None:
            streams.close()
        for fd in (ctl_r, ev_r):
            if fd >= 0:
                os.close(fd)
        if uid is not None:
            _UIDS.release(uid)
        shutil.rmtree(tmp, ignore_errors=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the execution's process group (boot, init, and whatever stayed in it; in a
    PID namespace init's death takes the rest) and reap boot."""
    if proc.returncode is None:  # not reaped: its pid is still its group's
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
