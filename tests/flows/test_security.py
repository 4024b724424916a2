"""The threat model's defaults, checked on the real services (docs/security.md): everything
`flexmarl train` starts listens on loopback only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# Start what `flexmarl train` starts on the embedded defaults (its own Prefect server, a
# local Dask cluster), then list every listening socket of this process and its children.
LISTENERS = """
import json, psutil
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api

with prefect_api() as api, dask_cluster(ClusterConfig()) as workers:
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    found = []
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        found += [
            [p.pid, " ".join(p.cmdline()[:3]), c.laddr.ip, c.laddr.port]
            for c in conns
            if c.status == psutil.CONN_LISTEN
        ]
    print(json.dumps({"api": api, "scheduler": workers.address, "listen": found}))
"""


def test_the_default_services_listen_on_loopback_only() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    out = subprocess.run(
        [sys.executable, "-c", LISTENERS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["api"].startswith("http://127.0.0.1:")
    assert doc["scheduler"].startswith("tcp://127.0.0.1:")
    listen = doc["listen"]
    ports = {port for *_, port in listen}
    api_port = int(doc["api"].split(":")[2].split("/")[0])
    scheduler_port = int(doc["scheduler"].rsplit(":", 1)[1])
    assert {api_port, scheduler_port} <= ports  # the check saw the services themselves
    exposed = [entry for entry in listen if entry[2] not in ("127.0.0.1", "::1")]
    assert not exposed, f"listening beyond loopback: {exposed}"
