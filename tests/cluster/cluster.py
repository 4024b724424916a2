"""A FlexMARL cluster over namespace hosts (tests/cluster/hosts.py), as a user starts one
by hand: `dask scheduler` with TLS on one host, an S3 server (moto) on another, `flexmarl
worker --role ...` on one host per worker, and a driver host that runs `flexmarl` commands.
No host shares files with another: models go to S3 (`flexmarl model push`), the MEG Store,
states and checkpoints live on S3, the run directory on the driver."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.cluster.start import QUIET_DASK
from tests.cluster.hosts import PYTHON, Host, Hosts, namespace_hosts, wait_port
from tests.cluster.tls import TlsFiles, make_tls

SCHEDULER_PORT, S3_PORT = 8786, 5000
# every tool from the interpreter running the tests, never from PATH (a fresh machine has no
# `prefect`, `dask` or `flexmarl` on it; the hosts' PATH holds only the system's directories)
FLEXMARL = (PYTHON, "-m", "flows.cli")
DASK = (PYTHON, "-m", "dask")
PREFECT = (PYTHON, "-m", "prefect")
# one Prefect server for every `flexmarl` command of the driver, on the driver's loopback (the
# API reachable by the driver only); without it each command started a temporary server
PREFECT_PORT = 4200
PREFECT_API = f"http://127.0.0.1:{PREFECT_PORT}/api"
INSIDE_TLS = TlsFiles(Path("/tmp/tls/ca.pem"), Path("/tmp/tls/cert.pem"), Path("/tmp/tls/key.pem"))
BUCKET = "flexmarl"
# Every process of the cluster (scheduler included): Dask's housekeeping timers as flexmarl
# sets them, and connection timeouts of 90 s instead of 30 s. The seven hosts share this
# machine's two cores with the rest of the suite, and a starved scheduler once answered a
# TLS handshake 19 s late: the driver's client lost the scheduler and the run stopped.
DASK_ENV = {
    **QUIET_DASK,
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "90s",
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "90s",
}


@dataclass
class Cluster:
    hosts: Hosts
    scheduler: str  # tls://IP:PORT
    s3: str  # http://IP:PORT

    @property
    def driver(self) -> Host:
        return self.hosts["driver"]

    def env(self, tls: bool = True) -> dict[str, str]:
        """What every process of the cluster needs: S3 through the environment, TLS."""
        return {
            "AWS_ENDPOINT_URL": self.s3,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            **DASK_ENV,
            **(INSIDE_TLS.dask_env() if tls else {}),
        }

    def driver_env(self, tls: bool = True) -> dict[str, str]:
        """`env(tls)` plus the driver's Prefect API."""
        return {**self.env(tls), "PREFECT_API_URL": PREFECT_API}

    def start_worker(self, host: Host, role: str, name: str, tls: bool = True) -> None:
        cmd = [*FLEXMARL, "worker", self.scheduler, "--role", role, "--name", name]
        cmd += ["--host", host.ip, *(INSIDE_TLS.dask_args() if tls else [])]
        host.start(cmd, env=self.env(), log=f"worker-{name}")

    def workers(self) -> dict[str, Any]:
        """Name -> the scheduler's record of each connected worker (asked from the driver)."""
        code = (
            "import json; from distributed import Client\n"
            f"with Client('{self.scheduler}', timeout=60) as c:\n"
            "    info = c.scheduler_info(n_workers=-1)['workers']\n"
            "    print(json.dumps({w['name']: w for w in info.values()}, default=str))"
        )
        out = self.driver.run([PYTHON, "-c", code], env=self.env(), timeout=120)
        if out.returncode:
            raise RuntimeError(f"cannot ask the scheduler:\n{out.stderr[-3000:]}")
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    def wait_workers(self, n: int, timeout: float = 180) -> None:
        code = (
            "from distributed import Client\n"
            f"with Client('{self.scheduler}', timeout=60) as c:\n"
            f"    c.wait_for_workers({n}, timeout={timeout})"
        )
        out = self.driver.run([PYTHON, "-c", code], env=self.env(), timeout=timeout + 60)
        if out.returncode:
            raise RuntimeError(
                f"{n} workers did not join:\n{out.stderr[-3000:]}\n{self.hosts.logs()}"
            )

    def flexmarl(self, *args: str, timeout: float = 900, tls: bool = True) -> Any:
        """`flexmarl ARGS` on the driver host (`tls=False`: without the cluster's TLS
        settings, e.g. for a run on a local cluster of the driver's own)."""
        return self.driver.run([*FLEXMARL, *args], env=self.driver_env(tls), timeout=timeout)


def start_prefect(driver: Host, timeout: float = 180) -> None:
    """`prefect server start` on the driver's loopback, waited for until it answers."""
    env = {"PREFECT_HOME": "/tmp/prefect", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    driver.start([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(PREFECT_PORT)],
                 env=env, log="prefect")  # fmt: skip
    probe = f"import urllib.request; urllib.request.urlopen('{PREFECT_API}/health', timeout=2)"
    deadline = time.monotonic() + timeout
    while driver.run([PYTHON, "-c", probe], timeout=30).returncode != 0:
        if time.monotonic() > deadline or driver.procs[-1][0].poll() is not None:
            raise RuntimeError(f"the driver's Prefect server did not start\n{driver.logs()}")
        time.sleep(1)


@contextmanager
def multihost_cluster(
    workers: Sequence[tuple[str, str]], extra: Sequence[str] = ()
) -> Iterator[Cluster]:
    """Hosts `scheduler`, `s3`, one per (name, role) in `workers`, `driver` and `extra`
    (started empty); every worker joined before this yields."""
    names = ["scheduler", "s3", *(n for n, _ in workers), "driver", *extra]
    with namespace_hosts(names) as hosts:
        tls = make_tls(hosts["driver"].root.parent / "tls-src")
        for host in hosts.hosts.values():
            shutil.copytree(tls.ca.parent, host.root / "tls")
        sched, s3 = hosts["scheduler"], hosts["s3"]
        sched.start(
            [*DASK, "scheduler", "--host", sched.ip, "--port", str(SCHEDULER_PORT),
             "--protocol", "tls", "--no-dashboard", *INSIDE_TLS.dask_args()],
            env=DASK_ENV, log="scheduler",
        )  # fmt: skip
        s3.start([PYTHON, "-m", "moto.server", "-H", s3.ip, "-p", str(S3_PORT)], log="moto")
        start_prefect(hosts["driver"])
        wait_port(sched, SCHEDULER_PORT)
        wait_port(s3, S3_PORT)
        cluster = Cluster(hosts, f"tls://{sched.ip}:{SCHEDULER_PORT}", f"http://{s3.ip}:{S3_PORT}")
        mk = f"import s3fs; s3fs.S3FileSystem().mkdir('{BUCKET}')"
        made = cluster.driver.run([PYTHON, "-c", mk], env=cluster.env())
        assert made.returncode == 0, made.stderr
        for name, role in workers:
            cluster.start_worker(hosts[name], role, name)
        if workers:
            cluster.wait_workers(len(workers))
        yield cluster
