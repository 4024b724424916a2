"""The sandbox's launcher: confines one execution. Started by `workloads.sandbox_exec` as
`python -I -S -B sandbox_child.py boot CONFIG_JSON` (stdlib only: it runs without the
project's packages), never imported by untrusted code. Three processes, each with one job:

1. *boot* (the worker's uid): PR_SET_PDEATHSIG, so it dies with the thread that started it;
   in the namespace modes, `unshare(2)` of mount, network, PID, IPC and UTS namespaces (and
   a user namespace in mode `userns`), then `fork`.
2. *init* (PID 1 of the new PID namespace, or boot's child without one): builds a private
   root — a read-only tmpfs holding read-only binds of the interpreter's directories, three
   device nodes, the prelude, and a size-capped tmpfs work directory with the execution's
   files — and `chroot`s into it; forks the untrusted process, reaps everything, writes the
   untrusted process's wait status and CPU time to the control pipe and exits. PID 1
   exiting makes the kernel SIGKILL whatever is left in the namespace (a fork bomb's
   children, a `setsid` escapee).
3. *the untrusted process*: rlimits, supplementary groups dropped, an unprivileged uid/gid,
   PR_SET_NO_NEW_PRIVS, every descriptor but 0-2 and the event pipe (fd 3) closed, then
   `execve` of the isolated interpreter (`-I -S -B`, minimal environment) on the prelude
   (`workloads.sandbox_prelude`), which runs `main.py`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
EVENTS_FD, CTL_FD = 3, 4  # numbers in the untrusted process (the prelude reads fd 3)
INNER_ID = 1000  # the untrusted uid/gid inside a user namespace


def _libc(name: str, *args: Any) -> None:
    """Call libc's `name` (ctypes is loaded here only, never in the untrusted process)."""
    import ctypes

    fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    if fn(*(ctypes.c_ulong(a) if isinstance(a, int) else a for a in args)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args[:2]!r}: {os.strerror(err)}")


def _prctl(option: int, arg: int) -> None:
    _libc("prctl", option, arg, 0, 0, 0)


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def b(s: str | None) -> bytes | None:
        return s.encode() if s else None

    _libc("mount", b(src), b(target), b(fstype), flags, b(data))


def _locked_flags(path: str) -> int:
    """The flags of the mount `path` lives on that a read-only remount must keep
    (in a user namespace they are locked: leaving one out is EPERM)."""
    f = os.statvfs(path).f_flag
    flags = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    return flags | (MS_RELATIME if f & 4096 else 0)  # ST_RELATIME is 4096


def _bind_ro(src: str, target: str, *, device: bool = False) -> None:
    if os.path.isdir(src):
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        open(target, "a").close()
    try:
        _mount(src, target, None, MS_BIND)
    except OSError:  # a source with locked submounts may only be bound recursively
        _mount(src, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | _locked_flags(src)
    _mount(None, target, None, flags | (0 if device else MS_NODEV))


def _private_root(cfg: dict[str, Any], uid: int, gid: int) -> None:
    """Build the private root under `cfg["dir"]/root` and chroot into it (see module doc)."""
    root = os.path.join(cfg["dir"], "root")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=755")
    for path, link in cfg["links"]:
        os.symlink(link, root + path)
    for path in cfg["binds"]:
        _bind_ro(path, root + path)
    for path in cfg["devices"]:
        _bind_ro(path, root + path, device=True)
    work = os.path.join(root, "work")
    os.mkdir(work, 0o700)
    size = cfg["limits"]["workdir_mb"]
    opts = f"size={size}m,nr_inodes=256,mode=700,uid={uid},gid={gid}"
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    _stage(cfg, work, os.path.join(root, "sandbox"), uid, gid)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m")
    os.chroot(root)
    os.chdir("/work")


def _stage(cfg: dict[str, Any], work: str, lib: str, uid: int | None, gid: int | None) -> None:
    """Copy the execution's files into `work` (owned by the untrusted uid) and the prelude
    into `lib` (root-owned, read-only to the untrusted process)."""
    stage = os.path.join(cfg["dir"], "stage")
    for name in sorted(os.listdir(stage)):
        with open(os.path.join(stage, name), "rb") as f, open(os.path.join(work, name), "wb") as g:
            g.write(f.read())
        if uid is not None and gid is not None:
            os.chown(os.path.join(work, name), uid, gid)
    os.makedirs(lib, 0o755, exist_ok=True)
    with open(cfg["prelude"], "rb") as f, open(os.path.join(lib, "prelude.py"), "wb") as g:
        g.write(f.read())
    os.chmod(os.path.join(lib, "prelude.py"), 0o644)


def _set_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_s"])
    mib = 1 << 20
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2),
        (resource.RLIMIT_FSIZE, (limits["file_mb"] * mib,) * 2),
        (resource.RLIMIT_NPROC, (limits["processes"],) * 2),
        (resource.RLIMIT_NOFILE, (limits["open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MEMLOCK, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
    ):
        resource.setrlimit(res, value)


def _untrusted(cfg: dict[str, Any], ids: tuple[int, int] | None, events: int, ctl: int) -> None:
    """The untrusted process up to its `execve` (never returns)."""
    import fcntl

    try:
        events, ctl = fcntl.fcntl(events, fcntl.F_DUPFD, 10), fcntl.fcntl(ctl, fcntl.F_DUPFD, 10)
        os.dup2(events, EVENTS_FD)
        os.dup2(ctl, CTL_FD, inheritable=False)
        os.closerange(CTL_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        _set_limits(cfg["limits"])
        if ids is not None:
            if cfg["mode"] != "userns":
                os.setgroups([])
            os.setresgid(ids[1], ids[1], ids[1])
            os.setresuid(ids[0], ids[0], ids[0])
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        lib = "/sandbox" if cfg["mode"] in ("namespaces", "userns") else cfg["dir"] + "/sandbox"
        argv = [cfg["python"], "-I", "-S", "-B", lib + "/prelude.py", str(cfg["guard"])]
        os.execve(cfg["python"], argv, cfg["env"])
    except BaseException as e:
        os.write(CTL_FD, (json.dumps({"setup_error": f"{type(e).__name__}: {e}"}) + "\n").encode())
    os._exit(127)


def _init(cfg: dict[str, Any], events: int, ctl: int) -> None:
    """PID 1 (or boot's child): private root, the untrusted process, reaping (never returns)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        mode, uid = cfg["mode"], cfg["uid"]
        ids = None if uid is None else (INNER_ID, INNER_ID) if mode == "userns" else (uid, uid)
        if mode in ("namespaces", "userns"):
            assert ids is not None
            _private_root(cfg, *ids)
        else:
            work = os.path.join(cfg["dir"], "work")
            _stage(cfg, work, os.path.join(cfg["dir"], "sandbox"), *(ids or (None, None)))
            if ids is not None:
                os.chown(work, *ids)
            os.chdir(work)
        pid = os.fork()
        if pid == 0:
            _untrusted(cfg, ids, events, ctl)
        os.close(events)
        while True:  # reap every child (orphans are ours as PID 1) until the untrusted one
            got, status, usage = os.wait4(-1, 0)
            if got == pid:
                break
        doc: dict[str, Any] = {"cpu_s": usage.ru_utime + usage.ru_stime}
        if os.WIFSIGNALED(status):
            doc["signal"] = os.WTERMSIG(status)
        else:
            doc["exit"] = os.WEXITSTATUS(status)
        if mode == "uid":
            kill_uid(uid)  # no PID namespace: whatever the code left behind
        os.write(ctl, (json.dumps(doc) + "\n").encode())
    except BaseException as e:
        os.write(ctl, (json.dumps({"setup_error": f"{type(e).__name__}: {e}"}) + "\n").encode())
    os._exit(0)


def _enter_userns(flags: int, cfg: dict[str, Any]) -> None:
    """unshare into a user namespace (with `flags`) whose INNER_ID is the untrusted id.

    Without root only our own ids can be mapped, and we map them ourselves. Root maps 0 to
    itself (init writes the work files as 0) and INNER_ID to the allocated uid; a process
    may map other ids only from the parent namespace, so a helper forked before `unshare`
    writes the maps."""
    if os.getuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        _libc("unshare", flags | CLONE_NEWUSER)
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{INNER_ID} {uid} 1\n"),
            ("gid_map", f"{INNER_ID} {gid} 1\n"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return
    me, (go_r, go_w), (done_r, done_w) = os.getpid(), os.pipe(), os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(go_w)
        os.close(done_r)
        try:
            if os.read(go_r, 1) == b"1":
                line = f"0 0 1\n{INNER_ID} {cfg['uid']} 1\n"
                for name, text in (("setgroups", "deny"), ("uid_map", line), ("gid_map", line)):
                    with open(f"/proc/{me}/{name}", "w") as f:
                        f.write(text)
                os.write(done_w, b"1")
        finally:
            os._exit(0)
    os.close(go_r)
    os.close(done_w)
    try:
        _libc("unshare", flags | CLONE_NEWUSER)
        os.write(go_w, b"1")
    finally:
        os.close(go_w)
        ok = os.read(done_r, 1)
        os.waitpid(helper, 0)
    if ok != b"1":
        raise OSError("could not write the user namespace's id maps")


def boot(cfg: dict[str, Any]) -> None:
    events, ctl = cfg["events_fd"], cfg["ctl_fd"]
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getuid() == 0:
            os.setgroups([])
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if cfg["mode"] == "userns":
            _enter_userns(flags, cfg)
        elif cfg["mode"] == "namespaces":
            _libc("unshare", flags)
    except BaseException as e:
        os.write(ctl, (json.dumps({"setup_error": f"{type(e).__name__}: {e}"}) + "\n").encode())
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        _init(cfg, events, ctl)
    os.close(events)
    os.close(ctl)
    os.waitpid(pid, 0)
    os._exit(0)


def kill_uid(uid: int | None) -> int:
    """SIGKILL every process of `uid` (root only; for the mode without a PID namespace,
    where a process that left the process group outlives its execution). Returns how many."""
    if uid is None:
        return 0
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                line = next(x for x in f if x.startswith("Uid:"))
            if int(line.split()[1]) == uid:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except (OSError, StopIteration, ValueError):
            continue
    return killed


if __name__ == "__main__":
    boot(json.loads(sys.argv[2]))
