"""Hosts for multi-host tests: Linux network namespaces on this machine.

Each host is a network namespace with one veth into a bridge of a private /24 subnet this
harness creates (and deletes), its own loopback, and a private filesystem view: every
process of a host runs under `unshare --mount` with the host's own directory bind-mounted
over `/tmp` and `HOME` set inside it, so no host sees another's files (the project and its
virtual environment stay visible: FlexMARL installed on every host, also when the checkout
itself lies under `/tmp`, as a CI clone may). A host's PATH holds the system's directories
only, as on a fresh machine: tools are started from the interpreter (`PYTHON -m prefect`).
Only the subnet's own addresses and loopback are used.

Needs root (namespaces, bridges); `available()` says why not where it cannot run.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the interpreter running the tests (the project's virtualenv): every host runs it by path
PYTHON = sys.executable
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # iproute2 lives in sbin on some systems
IP = shutil.which("ip", path=SYSTEM_PATH) or "ip"


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, a bridge, private mounts)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool, path=SYSTEM_PATH) is None:
            return f"multi-host tests need `{tool}` (iproute2 / util-linux)"
    return None


def _under_tmp(*paths: Path) -> list[str]:
    """The distinct `paths` below /tmp, relative to it ("/ci/main"), outermost first."""
    tmp = Path("/tmp").resolve()
    rels: list[str] = []
    for path in sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts)):
        if path.is_relative_to(tmp) and not any(
            path.is_relative_to(tmp / r.lstrip("/")) for r in rels
        ):
            rels.append("/" + str(path.relative_to(tmp)))
    return rels


def _ip(*args: str) -> None:
    subprocess.run([IP, *args], check=True, capture_output=True)


@dataclass
class Host:
    """One namespace host: `ip` on the bridge, `root` its private /tmp (seen from here)."""

    name: str
    ns: str
    ip: str
    root: Path
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        keep = ("LANG", "LC_ALL", "TERM")
        base = {k: v for k, v in os.environ.items() if k in keep}
        return {
            **base,
            "PATH": SYSTEM_PATH,
            "HOME": "/tmp/home",
            "TMPDIR": "/tmp",
            "PYTHONUNBUFFERED": "1",
            **(extra or {}),
        }

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` inside this host: its namespace, /tmp = its private directory. Paths the
        host must still see under /tmp (the checkout, the interpreter) are bound into the
        private directory at the same place first."""
        binds = "".join(
            f'mkdir -p "$FX_ROOT{rel}" && mount --bind "/tmp{rel}" "$FX_ROOT{rel}" && '
            for rel in _under_tmp(REPO, Path(sys.prefix), Path(sys.base_prefix))
        )
        inner = f'{binds}mount --rbind "$FX_ROOT" /tmp && mkdir -p /tmp/home && exec "$@"'
        return [
            IP, "netns", "exec", self.ns,
            "unshare", "--mount", "--propagation", "private",
            "env", f"FX_ROOT={self.root}", "sh", "-c", inner, "sh", *cmd,
        ]  # fmt: skip

    def start(
        self, cmd: Sequence[str], env: dict[str, str] | None = None, log: str = ""
    ) -> subprocess.Popen[bytes]:
        """A background process on this host (its own process group), output to `log`."""
        out = self.root / f"{log or Path(cmd[0]).name}.log"
        with out.open("ab") as f:
            proc = subprocess.Popen(
                self.argv(cmd), env=self.env(env), stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=Path(__file__).resolve().parents[2],
            )  # fmt: skip
        self.procs.append((proc, out))
        return proc

    def run(
        self, cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """A command on this host, waited for; its output captured."""
        return subprocess.run(
            self.argv(cmd), env=self.env(env), capture_output=True, text=True, timeout=timeout,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL every process this host started (what losing the host does)."""
        for proc, _ in self.procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc, _ in self.procs:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}" for _, p in self.procs
        )


@dataclass
class Hosts:
    subnet: str
    bridge: str
    hosts: dict[str, Host]

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def logs(self) -> str:
        return "\n".join(f"===== {h.name} ({h.ip})\n{h.logs()}" for h in self.hosts.values())


def wait_port(host: Host, port: int, timeout: float = 120) -> None:
    """Block until something listens on host.ip:port (checked from inside the host)."""
    deadline = time.monotonic() + timeout
    probe = f"import socket; socket.create_connection(('{host.ip}', {port}), timeout=1).close()"
    while time.monotonic() < deadline:
        if host.run([PYTHON, "-c", probe], timeout=30).returncode == 0:
            return
        if any(p.poll() is not None for p, _ in host.procs):
            break
        time.sleep(0.5)
    raise RuntimeError(f"nothing listens on {host.ip}:{port} ({host.name})\n{host.logs()}")


def _free_subnet() -> str:
    """A 10.x.y/24 that no route of this machine covers (never shadow a real network)."""
    import ipaddress

    routes = subprocess.run([IP, "-4", "route"], capture_output=True, text=True).stdout
    taken = []
    for line in routes.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest != "default" and "/" in dest:
            taken.append(ipaddress.ip_network(dest, strict=False))
    for _ in range(1000):
        net = ipaddress.ip_network(
            f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}.0/24"
        )
        if not any(net.overlaps(t) for t in taken):
            return str(net.network_address).rsplit(".", 1)[0]
    raise RuntimeError("no free 10.x.y.0/24 for the test hosts")


@contextmanager
def namespace_hosts(names: Sequence[str]) -> Iterator[Hosts]:
    """Hosts `names` on a fresh bridge and /24; everything removed afterwards, also on
    failure (processes killed, namespaces, links and private directories deleted)."""
    tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
    subnet = _free_subnet()
    bridge = f"fxb{tag}"
    base = Path(tempfile.mkdtemp(prefix="flexmarl-hosts-"))
    made: list[Host] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            ns, veth = f"fx{tag}{i}", f"fxv{tag}{i}"
            host = Host(name, ns, f"{subnet}.{10 + i}", base / name)
            host.root.mkdir()
            _ip("netns", "add", ns)
            made.append(host)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "netns", ns)
            _ip("link", "set", veth, "master", bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", f"{veth}p")
            _ip("-n", ns, "link", "set", f"{veth}p", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield Hosts(subnet, bridge, {h.name: h for h in made})
    finally:
        for host in made:
            host.kill()
        for host in made:
            with suppress(subprocess.CalledProcessError):
                _ip("netns", "del", host.ns)
        with suppress(subprocess.CalledProcessError):
            _ip("link", "del", bridge)
        shutil.rmtree(base, ignore_errors=True)
