"""LoRA agents on one shared base against full copies: fanout's five agents, side by side.

    python -m bench.lora [--small] [--json PATH] [--steps N] [--episodes N] [--repeats R]
                         [--layers L] [--hidden H] [--arms full,lora] [--memory-limit M]

Two arms of the same `train` flow on the same workload (fanout: planner → three workers →
aggregator), the same model, the same default cluster (one rollout worker, one training
worker with 2 slots), interleaved `R` times:

- `full`: every agent trains its own full copy of the model (five engines, five trainers);
- `lora`: every agent is a LoRA adapter (r = 8 on q/k/v/o) on one base — one rollout engine
  serving five adapters, one resident base on the training worker.

Each arm gets a fresh cluster, so a worker's peak RSS (`VmHWM` of its process at the end of
the arm) is that arm's. Keys (LoRA over full copies; < 1 means LoRA needs less):

- `rollout_rss_ratio`, `train_rss_ratio`: peak RSS of the rollout / training worker (target
  ≤ 0.4);
- `publish_time_ratio`: median time of one weight publication (`publish_ms_median`);
- `swap_time_ratio`: mean time of one slot swap (out or in) on the training worker;
- `step_time_ratio`: median step time over steps ≥ 1 (target ≤ 1: no slower).

The model is a random Llama built locally (`workloads.tiny_model`, default 14 layers × 768
hidden, 12 heads, MLP 2048, vocabulary 512: ~100 M parameters, fp32), big enough that the
weights dominate each worker's memory; being random, it samples every response to its
token budget.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from bench.common import train_run, write_results
from bench.e2e import steady_state
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api
from flows.report.memory import model_parameters
from workloads import BUILTIN

ARMS = ("full", "lora")
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def config_copy(arm: str, model: str, out: Path, steps: int, episodes: int) -> Path:
    data = yaml.safe_load(BUILTIN["fanout"].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
        if arm == "lora":
            agent["lora"] = LORA
    data["run"] = {"steps": steps, "episodes_per_step": episodes, "micro_batches": 2}
    path = out / f"fanout-{arm}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def _swap_stats() -> dict[str, float]:
    """Run on the training worker: the slot managers' swap counters, summed."""
    from tasks import worker

    out = {"swaps": 0.0, "swap_s": 0.0, "bytes": 0.0}
    for slots in worker._SLOTS.values():
        st = slots.stats
        out["swaps"] += st.swaps_out + st.swaps_in
        out["swap_s"] += st.swap_out_s + st.swap_in_s
        out["bytes"] += st.bytes_out + st.bytes_in
    return out


def run_arm(arm: str, cfg: Path, run_dir: Path, memory_limit: str = "auto") -> dict[str, Any]:
    from distributed import Client

    with dask_cluster(ClusterConfig(memory_limit=memory_limit)) as workers:
        out = train_run(cfg, run_dir, workers.address)
        with Client(workers.address) as client:  # read while the workers still live
            info = client.scheduler_info(n_workers=-1)["workers"]
            addr = {w["name"]: a for a, w in info.items()}
            pids = client.run(os.getpid)
            swaps = client.run(_swap_stats, workers=[addr[workers.train[0]]])
            rollout_rss = _peak_rss(pids[addr[workers.rollout[0]]])
            train_rss = _peak_rss(pids[addr[workers.train[0]]])
    steps = json.loads((run_dir / "timeline.json").read_text())
    st = steady_state(out, run_dir)
    sw = next(iter(swaps.values()))
    return {
        "step_s": st["step_s"],
        "violations": st["violations"],
        "rollout_rss_mb": round(rollout_rss / 2**20, 1),
        "train_rss_mb": round(train_rss / 2**20, 1),
        "publish_ms": out["publish_ms_median"],
        "swap_ms": round(1e3 * sw["swap_s"] / sw["swaps"], 2) if sw["swaps"] else 0.0,
        "swaps": int(sw["swaps"]),
        "swap_mb": round(sw["bytes"] / max(sw["swaps"], 1) / 2**20, 2),
        "tasks": len(steps),
    }


def ratios(arms: dict[str, dict[str, Any]]) -> dict[str, float]:
    if set(arms) != set(ARMS):  # one arm alone (`--arms lora`): nothing to compare
        return {}
    lora, full = arms["lora"], arms["full"]

    def r(key: str) -> float:
        return round(lora[key] / full[key], 4) if full[key] else float("nan")

    return {
        "rollout_rss_ratio": r("rollout_rss_mb"),
        "train_rss_ratio": r("train_rss_mb"),
        "publish_time_ratio": r("publish_ms"),
        "swap_time_ratio": r("swap_ms"),
        "step_time_ratio": r("step_s"),
    }


def run(
    model: str,
    steps: int,
    episodes: int,
    work: Path,
    repeats: int = 1,
    arms: tuple[str, ...] = ARMS,
    memory_limit: str = "auto",
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "model": model,
        "model_parameters": model_parameters(model),
        "steps": steps,
        "episodes_per_step": episodes,
        "repeats": repeats,
        "lora": LORA,
        "memory_limit": memory_limit,
    }
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with prefect_api():
        for rep in range(repeats):
            for arm in arms:
                cfg = config_copy(arm, model, work, steps, episodes)
                runs[arm].append(run_arm(arm, cfg, work / f"{arm}-{rep}", memory_limit))
    medians = {
        a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} | {"repeats": rs}
        for a, rs in runs.items()
    }
    results["arms"] = medians
    results |= ratios(medians)
    return results


def render(results: dict[str, Any]) -> None:
    con = Console()
    t = Table(
        title=f"fanout, 5 agents, {results['model_parameters'] / 1e6:.0f} M-parameter base, "
        f"{results['steps']} steps × {results['episodes_per_step']} episodes "
        f"(median of {results['repeats']})"
    )
    cols = ("rollout_rss_mb", "train_rss_mb", "publish_ms", "swap_ms", "swap_mb", "step_s")
    t.add_column("arm")
    for c in cols:
        t.add_column(c, justify="right")
    for arm, m in results["arms"].items():
        t.add_row(arm, *(f"{m[c]:,.2f}" for c in cols))
    con.print(t)
    if "step_time_ratio" not in results:
        return
    con.print(
        "LoRA / full: "
        + ", ".join(
            f"{k} {results[k]:.3f}"
            for k in (
                "rollout_rss_ratio",
                "train_rss_ratio",
                "publish_time_ratio",
                "swap_time_ratio",
                "step_time_ratio",
            )
        )
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="a tiny model, for the test suite")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--arms", default=",".join(ARMS), help="a subset of: full,lora")
    ap.add_argument(
        "--memory-limit",
        default="auto",
        help="per-worker memory limit of the cluster (auto: RAM / workers; a bigger base "
        "needs more for five full copies)",
    )
    a = ap.parse_args(argv)
    steps = a.steps or (2 if a.small else 3)
    episodes = a.episodes or (2 if a.small else 4)
    from workloads.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        if a.small:
            model = build_tiny_model(Path(tmp) / "model")
        else:
            model = build_tiny_model(
                Path(tmp) / "model",
                layers=a.layers,
                hidden=a.hidden,
                heads=a.hidden // 64,
                intermediate=a.hidden * 8 // 3,
            )
        arms = tuple(a.arms.split(","))
        if not set(arms) <= set(ARMS):
            ap.error(f"--arms: unknown arm in {a.arms!r}; known: {', '.join(ARMS)}")
        results = run(str(model), steps, episodes, Path(tmp), a.repeats, arms, a.memory_limit)
    render(results)
    if a.json:
        write_results(results, a.json)
    return results


if __name__ == "__main__":
    main()
