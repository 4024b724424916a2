"""The sandbox's prelude: the first code of the untrusted process, inside the sandbox.

`workloads.sandbox_child` copies this file into the sandbox (read-only, root-owned) and
`execve`s `python -I -S -B prelude.py GUARD` as the untrusted uid, in the work directory
that holds `main.py`. Stdlib only (no project package is importable in there).

With GUARD `True` it installs an audit hook (PEP 578: it cannot be removed from Python)
that stops a forbidden action at once — starting processes, sending signals, sockets,
ctypes, gc introspection, paths outside the work directory (writes) or outside the work
directory and the standard library (reads) — reporting it on the event pipe (fd 3). Then
it executes `main.py` as `__main__`; an uncaught exception that is a limit talking
(`limit_of`: MemoryError, EFBIG, EAGAIN, EMFILE) is reported there too. The hook is
defence in depth that names the reason; the confinement does not depend on it (the tests
run every hostile case with and without it).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

EVENTS_FD = 3  # the event pipe, as `workloads.sandbox_child` hands it over

FORBIDDEN = frozenset(
    {
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__",
        "socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
        "ctypes.call_function", "os.symlink", "os.link", "resource.prlimit", "gc.get_objects",
        "gc.get_referrers", "gc.get_referents",
    }
)  # fmt: skip
FORBIDDEN_IMPORTS = frozenset({"_posixsubprocess", "_ctypes", "_socket", "_multiprocessing"})
_WRITES = frozenset(
    {
        "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime",
        "os.truncate", "shutil.rmtree", "os.chflags", "os.setxattr", "os.removexattr",
    }
)  # fmt: skip
_READS = frozenset({"os.listdir", "os.scandir", "os.chdir"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _guard(work: str, lib: str) -> None:
    """Install the audit hook: a forbidden action is reported on the event pipe and the
    process ends at once (`os._exit`: nothing the code does can catch it).

    Everything the hook uses is bound here, so code that patches modules or builtins
    (`os._exit = ...`, `builtins.any = ...`, the prelude's globals) cannot change what it
    does; paths are normalised lexically (no symlink can be made, so none can mislead it);
    a path that is not `str`, `bytes` or a descriptor (a `PathLike` could answer the hook
    and the `open` differently) is refused."""
    exit_, write, getcwd, dumps, type_ = os._exit, os.write, os.getcwd, json.dumps, type
    str_, bytes_, int_, none, any_ = str, bytes, int, type(None), any
    forbidden, imports, writes_ev, reads_ev = FORBIDDEN, FORBIDDEN_IMPORTS, _WRITES, _READS
    stdlib = tuple(p for p in sys.path if p)
    readable = (work, lib, *stdlib, "/dev/null", "/dev/urandom", "/dev/zero")

    def inside(path: Any, roots: tuple[str, ...]) -> bool:
        t = type_(path)
        if t is int_:
            return True  # an open descriptor
        if t is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        elif t is not str_:
            return False
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        parts: list[str] = []
        for part in path.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        norm = "/" + "/".join(parts)
        return any_(norm == root or norm.startswith(root + "/") for root in roots)

    def stop(event: str, args: tuple[Any, ...]) -> None:
        try:
            write(EVENTS_FD, (dumps({"forbidden": f"{event} {args!r}"[:200]}) + "\n").encode())
        finally:
            exit_(97)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in forbidden:
            stop(event, args)
        elif event == "import" and args[0] in imports:
            stop(event, args[:1])
        elif event == "open":
            path, mode, flags = args
            w = type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
            w = w or (type_(flags) is int_ and flags & _WRITE_FLAGS != 0)
            if type_(path) is not none and not inside(path, (work,) if w else readable):
                stop(event, args)
        elif event in writes_ev:
            for arg in args[: 2 if event == "os.rename" else 1]:
                if not inside(arg, (work,)):
                    stop(event, args)
        elif event in reads_ev and args and type_(args[0]) is not none:  # noqa: SIM102
            if not inside(args[0], readable):
                stop(event, args)

    sys.addaudithook(hook)


def limit_of(exc: BaseException) -> str | None:
    """Which limit an exception is the sandbox's limits talking ("memory", "file size",
    "processes", "open files"), or None for an ordinary error. Python ignores SIGXFSZ and
    turns a refused allocation, fork or thread into an exception, so these are the limits'
    voice inside the process; a harness that catches the code's exceptions must re-raise
    these (`import sandbox_runtime; sandbox_runtime.limit_of(e)`)."""
    import errno

    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, OSError):
        return {
            errno.EFBIG: "file size",
            errno.EAGAIN: "processes",
            errno.EMFILE: "open files",
        }.get(exc.errno or 0)
    if type(exc) is RuntimeError and "can't start new thread" in str(exc):
        return "processes"
    return None


def run(guard: bool) -> None:
    """Execute `main.py` of the current directory as `__main__` (see module doc)."""
    import builtins
    import traceback
    import types

    write, dumps, exit_ = os.write, json.dumps, os._exit
    runtime = types.ModuleType("sandbox_runtime", "What a harness inside the sandbox may use.")
    runtime.limit_of = limit_of  # type: ignore[attr-defined]
    sys.modules["sandbox_runtime"] = runtime
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    if guard:
        _guard(os.getcwd(), os.path.dirname(os.path.abspath(__file__)))
    scope = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    try:
        exec(compile(source, "main.py", "exec"), scope)
    except SystemExit:
        raise
    except BaseException as e:
        try:
            limit = limit_of(e)
            if limit is not None:
                write(EVENTS_FD, (dumps({"limit": limit}) + "\n").encode())
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            exit_(1)


if __name__ == "__main__":
    run(sys.argv[1] == "True")
