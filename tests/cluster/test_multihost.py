"""FlexMARL across hosts that share no files: namespace hosts (tests/cluster/hosts.py) for
the scheduler, an S3 server, one rollout and one training worker, and the driver; TLS on every
Dask connection; the model, the MEG Store, states and checkpoints on S3; the Prefect server
on the driver's loopback only."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import BUCKET, FLEXMARL, Cluster, multihost_cluster
from tests.cluster.hosts import PYTHON, available
from workloads import BUILTIN

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available() is not None, reason=str(available())),
]
MODEL = f"s3://{BUCKET}/models/tiny"
PUSH = ["model", "push", "/tmp/tiny", MODEL]


@pytest.fixture(scope="module")
def multihost() -> Iterator[Cluster]:
    """The hosts' cluster (`cluster`, in these tests, is the session's local one:
    tests/conftest.py)."""
    hosts = [("roll", "rollout"), ("trainer", "train")]
    with multihost_cluster(hosts, extra=("roll2", "trainer2", "stranger")) as c:
        # `flexmarl tiny-model /tmp/tiny`, then `flexmarl model push /tmp/tiny MODEL`: the
        # CLI's own entry point, both in one interpreter on the driver (a second start of
        # it, its imports, was ~10 s of CPU)
        code = (
            "import sys\nfrom flows.cli.main import main\n"
            f"sys.exit(main(['tiny-model', '/tmp/tiny']) or main({PUSH!r}))"
        )
        made = c.driver.run([PYTHON, "-c", code], env=c.driver_env(), timeout=900)
        assert made.returncode == 0, made.stderr[-3000:]
        yield c


def fanout_config(cluster: Cluster, steps: int = 2, workload: str = "fanout") -> str:
    """A built-in workload, unchanged but for its model (on S3), small sizes and the
    transformers rollout backend, written on the driver host; its path there.

    What these tests check is the cluster (no shared files, TLS, S3, losing a host), not the
    engine: with vLLM, importing it and starting an engine per agent on every new rollout
    host was most of their time (bench/multihost.py runs the cluster on vLLM)."""
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = MODEL
        agent["backend"] = "hf"
        agent.setdefault("sampling", {})["max_tokens"] = 8
    data["run"] = {"steps": steps, "episodes_per_step": 2, "micro_batches": 2, "seed": 0}
    (cluster.driver.root / f"{workload}.yaml").write_text(yaml.safe_dump(data))
    return f"/tmp/{workload}.yaml"


_CLIENTS: dict[str, Any] = {}


def one_host(multihost: Cluster, workload: str, tmp: Path, scheduler: str) -> dict[str, Any]:
    """The summary of `fanout_config(multihost, workload=workload)`'s run on one host: the
    session's local cluster (`scheduler`) in this process, the model read from the
    directory the driver pushed to S3 (the same files, so the S3 round trip is compared
    too), the store in `tmp`. Their trajectory does not depend on where the tasks ran, which
    is what the comparison shows. (A `flexmarl train --colocate` on the driver, a cluster
    of its own, was about a third of these tests' time.)"""
    from flows.cluster.start import ClusterConfig
    from flows.train import TrainParams, train

    data = yaml.safe_load((multihost.driver.root / f"{workload}.yaml").read_text())
    for agent in data["agents"].values():
        agent["model"] = str(multihost.driver.root / "tiny")
    cfg = tmp / f"{workload}.yaml"
    cfg.write_text(yaml.safe_dump(data))
    where = ClusterConfig(scheduler=scheduler)
    return train(
        TrainParams(config=str(cfg), run_dir=str(tmp / "run"), cluster=where, export_final=False)
    )


def s3_client(cluster: Cluster) -> Any:
    """A client of the cluster's S3 server (this test's own namespace reaches it over the
    bridge), listings never cached: every call asks the server. One per server, reused: a
    new client for every poll cost 0.2 s of CPU, and the polls below run every 0.5 s."""
    import s3fs

    if cluster.s3 not in _CLIENTS:
        _CLIENTS[cluster.s3] = s3fs.S3FileSystem(
            endpoint_url=cluster.s3, key="testing", secret="testing", skip_instance_cache=True,
            use_listings_cache=False,
        )  # fmt: skip
    return _CLIENTS[cluster.s3]


def consumed(cluster: Cluster, step: int) -> int:
    """How many agents have recorded their optimizer step `step` in the store (read from
    this test's own namespace, over the bridge, as any client of the S3 server would)."""
    return len(s3_client(cluster).glob(f"{BUCKET}/store/*/*/consumed/{step}.json"))


def when_step_done(cluster: Cluster, run: Any, step: int, agents: int = 5) -> None:
    deadline = time.monotonic() + 600
    while consumed(cluster, step) < agents:
        assert run.poll() is None, f"the run ended early:\n{cluster.hosts.logs()}"
        assert time.monotonic() < deadline, f"step {step} never finished\n{cluster.hosts.logs()}"
        time.sleep(0.5)


def committed(cluster: Cluster, step: int) -> int:
    """Rollout segments of `step` committed so far, over all agents."""
    return len(s3_client(cluster).glob(f"{BUCKET}/store/*/*/commits/k{step:06d}-*.json"))


def test_fanout_on_hosts_that_share_no_files_losing_two(
    multihost: Cluster, cluster: str, tmp_path: Path
) -> None:
    """Two steps of fanout. Once step 0 is done the rollout host is lost and another host
    joins under its name; once that one has committed some of step 1, the training host is
    lost in the middle of step 1, and another joins under its name."""
    cfg = fanout_config(multihost, steps=2)
    run = multihost.driver.start(
        [*FLEXMARL, "train", cfg, "--scheduler", multihost.scheduler,
         "--store", f"s3://{BUCKET}/store", "--run-dir", "/tmp/run",
         "--summary-json", "/tmp/run/summary.json"],
        env=multihost.driver_env(), log="train",
    )  # fmt: skip
    when_step_done(multihost, run, 0)
    multihost.hosts["roll"].kill()  # every process of the host: SIGKILL
    multihost.start_worker(multihost.hosts["roll2"], "rollout", "roll")
    deadline = time.monotonic() + 600
    while committed(multihost, 1) < 3:  # the new rollout host is at work on step 1
        assert run.poll() is None and time.monotonic() < deadline, multihost.hosts.logs()
        time.sleep(0.5)
    assert consumed(multihost, 1) < 5  # step 1 not trained yet: the loss is mid-step
    multihost.hosts["trainer"].kill()
    multihost.start_worker(multihost.hosts["trainer2"], "train", "trainer")
    assert run.wait(timeout=900) == 0, multihost.hosts.logs()
    summary = json.loads((multihost.driver.root / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["consistency"]["violations"] == 0
    # the independent audit: every step stepped on exactly its micro-batches, none twice
    assert summary["consistency"]["accounting_errors"] == 0
    assert summary["consistency"]["steps_unverified"] == 0
    assert summary["store_url"] == f"s3://{BUCKET}/store"
    # each worker host fetched the model from S3 into its own cache; none sees the run dir
    for name in ("roll", "trainer", "roll2", "trainer2"):
        host = multihost.hosts[name]
        cached = list((host.root / "home" / ".cache" / "flexmarl" / "models").glob("tiny-*"))
        assert cached and (cached[0] / "config.json").is_file(), name
        assert host.run(["test", "-e", "/tmp/run/summary.json"]).returncode == 1
    assert multihost.driver.run(["test", "-e", "/tmp/run/summary.json"]).returncode == 0
    # the final export was written by the driver from the checkpoints on S3
    assert (multihost.driver.root / "run" / "final" / "planner" / "config.json").is_file()
    # the same config on one host, never disturbed: the same trajectory
    one = one_host(multihost, "fanout", tmp_path, cluster)
    assert one["consistency"]["violations"] == 0
    assert trajectory(one) == trajectory(summary)


def test_math_chain_runs_the_same_on_one_host_and_on_many(
    multihost: Cluster, cluster: str, tmp_path: Path
) -> None:
    cfg = fanout_config(multihost, steps=2, workload="math-chain")
    out = multihost.flexmarl(
        "train", cfg, "--scheduler", multihost.scheduler, "--store", f"s3://{BUCKET}/mc-multi",
        "--run-dir", "/tmp/mc-multi", "--summary-json", "/tmp/mc-multi/summary.json",
        "--no-export-final",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    multi = json.loads((multihost.driver.root / "mc-multi" / "summary.json").read_text())
    one = one_host(multihost, "math-chain", tmp_path, cluster)
    assert multi["consistency"]["violations"] == one["consistency"]["violations"] == 0
    assert trajectory(multi) == trajectory(one)


def trajectory(summary: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Per step: the team reward, every agent's mean reward, the tokens decoded."""
    return [
        (r["team_reward"], sorted(r["reward_mean"].items()), r["decode_tokens"])
        for r in summary["per_step"]
    ]


def test_a_worker_without_the_certificate_cannot_join(multihost: Cluster) -> None:
    before = set(multihost.workers())
    stranger = multihost.hosts["stranger"]
    multihost.start_worker(stranger, "rollout", "intruder", tls=False)  # no certificate
    proc, log = stranger.procs[-1]
    deadline = time.monotonic() + 60
    while proc.poll() is None and "rror" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.5)  # it gives up (exits) or keeps failing its handshake
    after = set(multihost.workers())  # asked once: each ask is a Python started on the driver
    assert "intruder" not in after and after == before
    text = log.read_text(errors="replace")
    assert "SSL" in text or "TLS" in text or "tls" in text, text[-3000:]


def test_paths_only_the_driver_has_are_named_before_the_run(multihost: Cluster) -> None:
    cfg = fanout_config(multihost)
    text = (multihost.driver.root / "fanout.yaml").read_text().replace(MODEL, "/tmp/tiny")
    (multihost.driver.root / "local.yaml").write_text(text)
    out = multihost.flexmarl(
        "meg", "validate", "/tmp/local.yaml", "--scheduler", multihost.scheduler
    )
    assert out.returncode == 2, out.stdout + out.stderr
    for worker in ("roll", "trainer"):
        assert f"worker {worker} (" in out.stderr and "has no model of agent" in out.stderr
    assert "flexmarl model push" in out.stderr and "Traceback" not in out.stderr
    ok = multihost.flexmarl("meg", "validate", cfg, "--scheduler", multihost.scheduler)
    assert ok.returncode == 0 and "every worker of" in ok.stdout, ok.stderr[-2000:]
    # a train with the default store (a folder under the driver's run dir) stops at start
    out = multihost.flexmarl(
        "train", cfg, "--scheduler", multihost.scheduler, "--run-dir", "/tmp/r2"
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "has no MEG Store folder /tmp/r2/store" in out.stderr, out.stderr[-3000:]
