"""The sandbox for model-written code: hostile code is contained — by the audit hook
(`guard=True`, the default) and, underneath, by the OS alone (`guard=False`) — and the
calling process stays alive and usable; ordinary code runs; executions run at once.

Everything runs for real: child processes, namespaces, rlimits. The OS-level tests need a
namespace mode (`namespaces` as root, `userns` otherwise); without one they are skipped
with the reason, since then the machine cannot contain them (docs/sandbox.md)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from workloads import sandbox as sb
from workloads.sandbox import (
    MODES,
    NAMESPACED,
    Limits,
    Sandbox,
    SandboxError,
    SandboxPool,
    SandboxResult,
    detect_isolation,
    probe,
)

ROOMY = Limits(timeout_s=30.0)  # for tests that must not meet the wall clock by accident


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox()


needs_namespaces = pytest.mark.skipif(
    detect_isolation() not in NAMESPACED,
    reason="no namespace isolation on this machine: the OS alone cannot contain this",
)


def _usable(box: Sandbox) -> None:
    """The calling process is alive and the sandbox still runs ordinary code."""
    r = box.run("print(6 * 7)")
    assert r.status == "ok" and r.stdout == "42\n", r


def _processes_of(uid: int | None) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except (OSError, ValueError):
            continue
        uids = [ln.split()[1] for ln in status.splitlines() if ln.startswith("Uid:")]
        if uids and int(uids[0]) == uid:
            out.append(int(entry))
    return out


def test_ordinary_code_runs_in_the_strongest_mode_here(box: Sandbox) -> None:
    r = box.run("import sys\nprint(sum(range(10)), sys.flags.isolated, sys.flags.no_site)")
    assert (r.status, r.exit_code, r.stdout, r.reason) == ("ok", 0, "45 1 1\n", "")
    assert r.isolation == box.isolation == detect_isolation() and not r.stopped
    if os.geteuid() == 0:
        assert box.isolation == "namespaces" and r.uid is not None and r.uid >= sb.UID_BASE


def test_wrong_code_is_an_error_not_a_stop(box: Sandbox) -> None:
    for source, why in (
        ("raise ValueError('no')", "ValueError: no"),
        ("def f(:\n", "SyntaxError"),
        ("assert 1 == 2", "AssertionError"),
    ):
        r = box.run(source)
        assert r.status == "error" and why in r.reason and not r.stopped, r
        assert r.raise_if_stopped() is r
    assert box.run("import sys; sys.exit(3)").exit_code == 3


def test_files_are_in_an_empty_work_directory_and_removed_after(box: Sandbox) -> None:
    r = box.run(
        "import os\nprint(sorted(os.listdir('.')), open('data.txt').read())\n"
        "open('out.txt', 'w').write('x')",
        files={"data.txt": "hello", "raw.bin": b"\x00\x01"},
    )
    assert r.stdout == "['data.txt', 'main.py', 'raw.bin'] hello\n", r
    assert "out.txt" not in box.run("import os; print(os.listdir('.'))").stdout


def test_the_environment_is_minimal(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    r = box.run("import os; print(sorted(os.environ))")
    assert "AWS" not in r.stdout and "hunter2" not in r.stdout
    assert set(eval(r.stdout)) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR"}
    stdin = box.run("import sys; print(repr(sys.stdin.read()))")
    assert stdin.stdout == "''\n"  # stdin is closed (/dev/null)


def test_an_infinite_loop_times_out(box: Sandbox) -> None:
    r = box.run("while True:\n    pass", limits=Limits(timeout_s=1.0, cpu_s=60))
    assert r.status == "timeout" and "wall-clock" in r.reason and r.stopped
    with pytest.raises(SandboxError, match="timeout"):
        r.raise_if_stopped()
    _usable(box)


def test_the_cpu_limit_kills(box: Sandbox) -> None:
    r = box.run("while True:\n    pass", limits=Limits(timeout_s=60.0, cpu_s=1))
    assert r.status == "limit" and "CPU" in r.reason and r.signal is not None, r


@pytest.mark.parametrize("guard", [True, False])
def test_a_10_gb_allocation_hits_the_memory_limit(box: Sandbox, guard: bool) -> None:
    r = box.run("x = bytearray(10 * 2**30)\nprint('allocated')", guard=guard)
    assert r.status == "limit" and "memory" in r.reason and "allocated" not in r.stdout
    _usable(box)


def test_a_big_file_hits_the_file_size_limit(box: Sandbox) -> None:
    r = box.run("open('big', 'wb').write(b'x' * (4 << 20))", limits=Limits(file_mb=1))
    assert r.status == "limit" and "file size" in r.reason, r


def test_output_is_capped_not_held(box: Sandbox) -> None:
    r = box.run("print('x' * 2_000_000)", limits=Limits(output_bytes=1000))
    assert r.status == "ok" and r.truncated and len(r.stdout) == 1000


def test_a_fork_bomb_is_forbidden(box: Sandbox) -> None:
    r = box.run("import os\nwhile True:\n    os.fork()")
    assert r.status == "forbidden" and "os.fork" in r.reason
    _usable(box)


@needs_namespaces
def test_a_fork_bomb_is_contained_by_the_os(box: Sandbox) -> None:
    """Without the hook: RLIMIT_NPROC stops it (its own uid: the limit binds), and the PID
    namespace's init takes every child it left when it exits."""
    counting = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
        "except OSError as e:\n    print(n, e.errno)"
    )
    r = box.run(counting, guard=False, limits=Limits(processes=8, timeout_s=30.0))
    forks, errno = map(int, r.stdout.split())
    assert r.status == "ok" and forks < 8 and errno == 11, r  # EAGAIN
    assert _processes_of(r.uid) == []  # the sleeping children are gone
    bomb = box.run("import os\nwhile True:\n    os.fork()", guard=False, limits=ROOMY)
    assert bomb.status == "limit" and "process limit" in bomb.reason, bomb
    assert _processes_of(bomb.uid) == []
    _usable(box)


@pytest.mark.parametrize("guard", [True, False])
def test_the_run_directory_cannot_be_read(box: Sandbox, tmp_path: Path, guard: bool) -> None:
    if not guard and box.isolation not in NAMESPACED:
        pytest.skip("no private root here: world-readable files are readable (docs/sandbox.md)")
    run = tmp_path / "run"
    (run / "store").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "store" / "secret").write_text("TOPSECRET")
    (run / "checkpoints" / "step-3.safetensors").write_text("WEIGHTS")
    os.chmod(tmp_path, 0o755)  # world-readable, as a run directory usually is
    for source in (
        f"print(open({str(run / 'store' / 'secret')!r}).read())",
        f"print(open({str(run / 'checkpoints' / 'step-3.safetensors')!r}).read())",
        f"import os; print(os.listdir({str(run)!r}))",
    ):
        r = box.run(source, guard=guard)
        assert "TOPSECRET" not in r.stdout + r.stderr and "WEIGHTS" not in r.stdout
        assert "store" not in r.stdout
        assert r.status == ("forbidden" if guard else "error"), r
    _usable(box)


@pytest.mark.parametrize("guard", [True, False])
def test_nothing_is_written_outside_its_directory(
    box: Sandbox, tmp_path: Path, guard: bool
) -> None:
    if not guard and box.isolation not in NAMESPACED:
        pytest.skip("no private root here: the code can write where its uid may")
    store = tmp_path / "store"
    store.mkdir()
    os.chmod(store, 0o777)  # even a directory anyone may write to
    targets = [store / "planted", Path(f"/tmp/flexmarl-sandbox-test-{os.getpid()}")]
    for target in targets:
        r = box.run(f"open({str(target)!r}, 'w').write('x')", guard=guard)
        assert r.status == ("forbidden" if guard else "error") and not target.exists(), r
    _usable(box)


@pytest.mark.parametrize("guard", [True, False])
def test_a_socket_reaches_nothing(box: Sandbox, guard: bool) -> None:
    if not guard and box.isolation not in NAMESPACED:
        pytest.skip("no network namespace here: the network is reachable")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        r = box.run(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "s.sendall(b'stolen')\nprint('sent')",
            guard=guard,
        )
        assert "sent" not in r.stdout and r.status == ("forbidden" if guard else "error"), r
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection is pending: nothing arrived
    _usable(box)


@pytest.mark.parametrize("guard", [True, False])
def test_it_cannot_kill_its_parent_or_the_caller(box: Sandbox, guard: bool) -> None:
    if not guard and box.isolation not in NAMESPACED:
        pytest.skip("no PID namespace here")
    for source in (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
    ):
        r = box.run(source, guard=guard)
        assert r.status == ("forbidden" if guard else "error"), r
    os.kill(os.getpid(), 0)  # we are alive
    _usable(box)


def test_the_pool_runs_executions_at_once(box: Sandbox) -> None:
    """Two sleeping executions overlap in time: each one's start precedes the other's end
    (timestamps taken inside the sandboxes; no wall-clock threshold)."""
    sleeper = "import time\nprint(time.time())\ntime.sleep(2)\nprint(time.time())"
    with SandboxPool(2, box) as pool:
        a, b = (f.result() for f in [pool.submit(sleeper, limits=ROOMY) for _ in range(2)])
    (a0, a1), (b0, b1) = (map(float, r.stdout.split()) for r in (a, b))
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)


def test_the_pool_keeps_order(box: Sandbox) -> None:
    with SandboxPool(3, box) as pool:
        results = pool.map([f"print({i})" for i in range(5)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]
    assert all(isinstance(r, SandboxResult) for r in results)


def test_bad_input_is_refused_clearly(box: Sandbox) -> None:
    with pytest.raises(TypeError, match="not str"):
        box.run(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plain name"):
        box.run("pass", files={"../escape": "x"})
    with pytest.raises(ValueError, match="plain name"):
        box.run("pass", files={"main.py": "x"})
    with pytest.raises(ValueError, match="cpu_s must be > 0"):
        Limits(cpu_s=0)
    with pytest.raises(ValueError, match="unknown sandbox isolation 'chroot'; known: namespaces"):
        Sandbox(isolation="chroot")
    with pytest.raises(ValueError, match="max_workers"):
        SandboxPool(0, box)


def test_every_mode_is_probed_and_the_fallback_runs_code() -> None:
    """Each mode either works here or says why; the weakest one always works."""
    for mode in MODES:
        assert probe(mode) is None or isinstance(probe(mode), str)
    weak = Sandbox(isolation="rlimits")
    assert weak.run("print(1)").stdout == "1\n"
    r = weak.run("import socket")  # the audit hook holds in every mode
    assert r.status == "forbidden" and r.isolation == "rlimits"


def test_without_namespaces_it_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Offer only the modes without namespaces: detection logs a warning and says which
    mode is in force (the probes are real)."""
    monkeypatch.setattr(sb, "_PREFERENCE", {True: ("uid", "rlimits"), False: ("rlimits",)})
    monkeypatch.setattr(sb, "_CHOSEN", [])
    monkeypatch.setattr(sb, "_WARNED", [])
    with caplog.at_level(logging.WARNING, logger="workloads.sandbox"):
        mode = detect_isolation()
        assert caplog.text == ""  # detecting alone is silent (a reward process warm-up)
        assert mode in ("uid", "rlimits") and Sandbox().isolation == mode
        Sandbox()
    assert caplog.text.count("sandbox: no namespaces") == 1 and repr(mode) in caplog.text


@pytest.mark.skipif(probe("userns") is not None, reason="no user namespaces here")
def test_the_user_namespace_mode_contains_too() -> None:
    """`userns` (the mode without root) runs code and has no network and no store."""
    box = Sandbox(isolation="userns")
    assert box.run("import os; print(os.getuid())").stdout == "1000\n"
    r = box.run("import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)", guard=False)
    assert r.status == "error" and "unreachable" in r.reason, r
    r = box.run("import os; print(os.listdir('/'))", guard=False)
    assert "work" in r.stdout and "tmp" not in r.stdout and "home" not in r.stdout
