"""Fanout on one host against the same run spread over hosts that share no files.

    sudo python -m bench.multihost [--small] [--steps 6] [--json bench/results/multihost.json]

Hosts are network namespaces on this machine (`tests/cluster/hosts.py`: a bridge, a private
/24, private mounts), as in the multi-host tests. Every arm runs the built-in fanout with its
model and MEG Store on an S3 server (moto) on a host of its own, so the store traffic is the
same kind in every arm:

- `single`: the driver's own local cluster (1 rollout + 1 training worker) on one host;
- `multi_1r2t`: a TLS scheduler host, 1 rollout and 2 training worker hosts, a driver host;
- `multi_2r1t`: the same with 2 rollout hosts and 1 training host.

Measured per arm: the median step time over steps >= 1 (step 0 loads the models), each
worker's utilization (its task time over the same window, `timeline.json`), and the bytes
every host sent, read from its network interfaces (`/proc/net/dev` inside its namespace):
what the S3 host sent and received is the store's traffic; everything else that crossed
the bridge, and the single host's own loopback, is Dask's (task messages, results,
transfers) and the driver's. All hosts share this machine's cores, so an extra host adds
processes, not capacity: the ratio says what distribution costs here, not what it gains on
real machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the harness lives with the tests (run from the repo root)
    sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from tests.cluster.cluster import BUCKET, Cluster, multihost_cluster  # noqa: E402
from tests.cluster.hosts import Host, available  # noqa: E402
from workloads import BUILTIN  # noqa: E402

MODEL = f"s3://{BUCKET}/models/tiny"
ARMS = {
    "multi_1r2t": [("roll0", "rollout"), ("train0", "train"), ("train1", "train")],
    "multi_2r1t": [("roll0", "rollout"), ("roll1", "rollout"), ("train0", "train")],
}


def net_dev(text: str) -> dict[str, tuple[int, int]]:
    """`/proc/net/dev` → interface: (bytes received, bytes sent)."""
    out = {}
    for line in text.splitlines()[2:]:
        name, data = line.split(":", 1)
        fields = data.split()
        out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def counters(host: Host) -> dict[str, tuple[int, int]]:
    return net_dev(host.run(["cat", "/proc/net/dev"]).stdout)


def traffic(hosts: list[Host]) -> dict[str, dict[str, int]]:
    """Per host, one read of its counters: `sent` on its veth, `received` on its veth, and
    `loopback` (bytes sent on `lo`)."""
    out = {}
    for h in hosts:
        dev = counters(h)
        veth = [v for name, v in dev.items() if name.startswith("fxv")]
        out[h.name] = {
            "sent": sum(tx for _, tx in veth),
            "received": sum(rx for rx, _ in veth),
            "loopback": dev.get("lo", (0, 0))[1],
        }
    return out


def config(cluster: Cluster, steps: int, episodes: int) -> str:
    data = yaml.safe_load(BUILTIN["fanout"].read_text())
    for agent in data["agents"].values():
        agent["model"] = MODEL
        agent.setdefault("sampling", {})["max_tokens"] = 16
    data["run"] = {"steps": steps, "episodes_per_step": episodes, "micro_batches": 2, "seed": 0}
    (cluster.driver.root / "fanout.yaml").write_text(yaml.safe_dump(data))
    return "/tmp/fanout.yaml"


def measure(cluster: Cluster, name: str, args: list[str], tls: bool, steps: int) -> dict[str, Any]:
    """One training run from the driver host; its figures and the bytes it moved."""
    hosts = list(cluster.hosts.hosts.values())
    before = traffic(hosts)
    out = cluster.flexmarl(*args, "--run-dir", f"/tmp/{name}", tls=tls, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{name} failed:\n{out.stderr[-4000:]}")
    run_dir = cluster.driver.root / name
    summary = json.loads((run_dir / "summary.json").read_text())
    tasks = json.loads((run_dir / "timeline.json").read_text())
    rows = [r for r in summary["per_step"] if r["step"] >= 1]
    begin = max(t["end"] for t in tasks if t["phase"] == "optimizer_step" and t["step"] == 0)
    end = max(t["end"] for t in tasks)
    busy: dict[str, float] = {}
    for t in tasks:
        busy[t["worker"]] = busy.get(t["worker"], 0.0) + max(
            0.0, min(t["end"], end) - max(t["start"], begin)
        )
    after = traffic(hosts)
    delta = {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in after}
    store = delta["s3"]["sent"] + delta["s3"]["received"]
    crossed = sum(d["sent"] for d in delta.values())
    loopback = delta["driver"]["loopback"] if not tls else 0
    measured_steps = max(1, steps - 1)
    return {
        "step_s": round(statistics.median(r["wall_s"] for r in rows), 3),
        "utilization": {w: round(b / (end - begin), 3) for w, b in sorted(busy.items())},
        "store_bytes_per_step": round(store / steps),
        "dask_bytes_per_step": round(max(0, crossed + loopback - store) / steps),
        "violations": summary["consistency"]["violations"],
        "team_reward": [r["team_reward"] for r in summary["per_step"]],
        "measured_steps": measured_steps,
    }


def run_arms(steps: int, episodes: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    # single: one host runs the driver and its local cluster; S3 on a host of its own
    with multihost_cluster([], extra=()) as c:
        setup(c)
        cfg = config(c, steps, episodes)
        store = f"s3://{BUCKET}/single"
        args = ["train", cfg, "--store", store, "--summary-json", "/tmp/single/summary.json"]
        results["single"] = measure(c, "single", args, tls=False, steps=steps)
    for arm, workers in ARMS.items():
        with multihost_cluster(workers) as c:
            setup(c)
            cfg = config(c, steps, episodes)
            args = ["train", cfg, "--scheduler", c.scheduler, "--store", f"s3://{BUCKET}/{arm}"]
            args += ["--summary-json", f"/tmp/{arm}/summary.json"]
            results[arm] = measure(c, arm, args, tls=True, steps=steps)
    return results


def setup(c: Cluster) -> None:
    for cmd in (["tiny-model", "/tmp/tiny"], ["model", "push", "/tmp/tiny", MODEL]):
        out = c.flexmarl(*cmd)
        if out.returncode:
            raise SystemExit(f"flexmarl {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")


def render(res: dict[str, Any]) -> None:
    t = Table(title=f"fanout, {res['steps']} steps × {res['episodes_per_step']} episodes")
    for col in (
        "arm",
        "step s",
        "× single",
        "utilization per worker",
        "store B/step",
        "Dask B/step",
    ):
        t.add_column(col, justify="left" if col in ("arm", "utilization per worker") else "right")
    base = res["arms"]["single"]["step_s"]
    for arm, r in res["arms"].items():
        util = " ".join(f"{u:.2f}" for u in r["utilization"].values())
        t.add_row(
            arm,
            f"{r['step_s']:.2f}",
            f"{r['step_s'] / base:.2f}",
            util,
            f"{r['store_bytes_per_step']:,}",
            f"{r['dask_bytes_per_step']:,}",
        )
    Console(width=130).print(t)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="3 steps × 2 episodes")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if (why := available()) is not None:
        ap.error(why)
    steps, episodes = (3, 2) if a.small else (a.steps, a.episodes)
    arms = run_arms(steps, episodes)
    res: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "steps": steps,
        "episodes_per_step": episodes,
        "arms": arms,
    }
    single = arms["single"]["step_s"]
    res["step_time_ratio_multi_vs_single"] = {
        arm: round(arms[arm]["step_s"] / single, 3) for arm in ARMS
    }
    res["same_rewards"] = all(arms[a]["team_reward"] == arms["single"]["team_reward"] for a in ARMS)
    render(res)
    if a.json:
        write_results(res, a.json)
    return res


if __name__ == "__main__":
    main()
