"""Soak: long runs with every process's memory, file descriptors and threads sampled per step.

    python -m bench.soak [--small] [--steps 200] [--warmup 50] [--workloads fanout,math-chain]
                         [--episodes 4] [--max-tokens 8] [--model DIR]
                         [--json bench/results/soak.json] [--png bench/results/soak.png]
                         [--scheduler ADDRESS]

Each workload is one real `train` run (default local cluster: one rollout and one training
worker, the Prefect server, flex mode, a checkpoint every step as by default) with small
steps, so that hundreds of steps fit in minutes. What would break a long run is whatever
grows a little every step; this benchmark makes that visible.

Sampling. A thread of this process watches the run's consumption log in the MEG Store
(`<run_dir>/store/<run>/<agent>/consumed/<step>.json`, written by every agent's optimizer
step): once every trained agent has recorded step k, it samples every process of the run
(`bench.procs`): the driver (this process), each Dask worker (`client.run`, by worker name),
the workers' own children (the reward pool) and the Prefect API server, with psutil: RSS,
file descriptors (`num_fds`: files, sockets and pipes, the budget `ulimit -n` limits;
regular files alone are kept too), threads, and the number of processes. The run itself
is not touched: no hook in the flow, no change of what it computes; the sampler only reads
directory listings (every 0.1 s) and runs a psutil call on each worker's event loop once per
step. Should two steps finish within one poll, the later one
gets the sample and the earlier none (`missed_steps` counts them).

Growth, per process, against its value at the end of the warm-up (the sample of the last
step < `--warmup`, when caches, compiled kernels, connection pools and the allocator have
settled) over the samples of the steps after it. The default warm-up, 50 steps, covers the
first period of the pipeline's lineage cut (every 20 steps, `flows.orchestrator.pipeline`) and the
driver's connection pools (its descriptors settle by step ~20); Dask's low-level message
logs (1,000 batches per connection, bounded) fill for ~120 steps more. `by_warmup` repeats
the keys for warm-ups of 20, 50 and 100 steps, from the same samples:

- `rss_growth_max` = (max RSS after warm-up - RSS at warm-up) / RSS at warm-up: the
  worst case, noise included; target < 0.10.
- `rss_growth_trend` = the slope of a least-squares line through the post-warm-up RSS,
  times the steps from the end of warm-up to the last step, / RSS at warm-up: the growth a
  steady leak explains, insensitive to a single spike.
- `open_files_growth` / `threads_growth` = last value - value at warm-up (target <= 0) of
  the open files (psutil's `open_files`: regular files) and the threads;
  `*_growth_max` the same with the post-warm-up maximum (a file open for a moment counts).
- `fds_growth` / `sockets_growth`: the same for every descriptor (files, sockets, pipes:
  what `ulimit -n` limits) and for the TCP/UDP sockets among them. Reported, not a target:
  a connection pool opening one more connection at a new peak of concurrent requests shows
  here as a step (+2 descriptors in the driver for a Dask client-to-scheduler connection,
  both ends being in that process), which `sockets_growth` attributes.
- `processes_growth`: the same for the number of processes in the run's tree (target <= 0).

Before the runs, `server_pools` fills the local Prefect server's lazily opened pools
(`bench.procs.fill_server_pools`: bursts of concurrent API reads), so that a pool reaching
a new high-water mark mid-run is not mistaken for a leak, nor a leak for a pool.

Each key is the maximum over the run's processes (per workload), and over the workloads at
the top level; `soak_ok` says whether every target held.

`--scheduler ADDRESS` (with `--small`, the test suite): the run on the running cluster at
ADDRESS (one rollout and one training worker, as the default one; the suite's session
cluster) instead of a fresh one: the test checks that the figures are those of the samples,
never the growth, and a cluster of its own (its start, its first engine) was ~27 s of its
~40 on 2 cores.
"""

from __future__ import annotations

import argparse
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
from bench.procs import StepSampler, fill_server_pools
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api
from workloads import BUILTIN

WORKLOADS = ("fanout", "math-chain")
METRICS = ("rss_mb", "fds", "sockets", "files", "threads")
RSS_TARGET = 0.10
KEYS = (  # the three, then the others (module docstring)
    "rss_growth_max",
    "open_files_growth",
    "threads_growth",
    "rss_growth_trend",
    "processes_growth",
)


def growth(steps: list[int], values: list[float | None], warmup: int) -> dict[str, float] | None:
    """Growth of one series after warm-up (module docstring): `warm` is the value at the last
    sampled step < `warmup`; `delta_*` absolute, `rel_*` relative to `warm`; `rel_trend` is
    the least-squares slope over steps >= `warmup` times (last step - (warmup - 1)) / warm.
    None when there is no sample on one side of the warm-up."""
    pts = sorted((s, v) for s, v in zip(steps, values, strict=True) if v is not None)
    before = [v for s, v in pts if s < warmup]
    after = [(s, v) for s, v in pts if s >= warmup]
    if not before or not after:
        return None
    warm, vals = before[-1], [v for _, v in after]
    xs = [float(s) for s, _ in after]
    mx, mv = statistics.fmean(xs), statistics.fmean(vals)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (v - mv) for x, v in zip(xs, vals, strict=True)) / var if var else 0.0
    span = after[-1][0] - (warmup - 1)
    rel = (lambda d: d / warm) if warm else (lambda d: 0.0 if d == 0 else float("inf"))
    return {
        "warm": warm,
        "last": vals[-1],
        "max": max(vals),
        "delta_last": vals[-1] - warm,
        "delta_max": max(vals) - warm,
        "rel_last": round(rel(vals[-1] - warm), 5),
        "rel_max": round(rel(max(vals) - warm), 5),
        "rel_trend": round(rel(slope * span), 5),
    }


def series(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples as columns: steps, seconds, and per process each metric (None where the
    process was not seen) and its pid (a changed pid is a restarted worker)."""
    procs = sorted({p for s in samples for p in s["procs"]})
    return {
        "steps": [s["step"] for s in samples],
        "t": [s["t"] for s in samples],
        "processes": [s.get("processes") for s in samples],
        "procs": {
            p: {m: [s["procs"].get(p, {}).get(m) for s in samples] for m in ("pid", *METRICS)}
            for p in procs
        },
    }


def summarize(cols: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Per process growth of every metric, and the workload's keys (maxima over processes)."""
    per: dict[str, dict[str, Any]] = {}
    for p, c in cols["procs"].items():
        per[p] = {m: growth(cols["steps"], c[m], warmup) for m in METRICS}
        per[p]["restarted"] = len({x for x in c["pid"] if x is not None}) > 1
    if not any(g["rss_mb"] is not None for g in per.values()):
        raise ValueError(f"no process has samples on both sides of the warm-up ({warmup} steps)")

    def worst(metric: str, key: str) -> float:
        return max(g[metric][key] for g in per.values() if g[metric] is not None)

    tree = growth(cols["steps"], cols["processes"], warmup)
    keys = {
        "rss_growth_max": worst("rss_mb", "rel_max"),
        "rss_growth_trend": worst("rss_mb", "rel_trend"),
        "open_files_growth": worst("files", "delta_last"),
        "open_files_growth_max": worst("files", "delta_max"),
        "fds_growth": worst("fds", "delta_last"),
        "fds_growth_max": worst("fds", "delta_max"),
        "sockets_growth": worst("sockets", "delta_last"),
        "threads_growth": worst("threads", "delta_last"),
        "threads_growth_max": worst("threads", "delta_max"),
        "processes_growth": tree["delta_last"] if tree else 0,
    }
    return keys | {"soak_ok": ok(keys), "per_process": per}


def ok(keys: dict[str, Any]) -> bool:
    return bool(
        keys["rss_growth_max"] < RSS_TARGET
        and keys["open_files_growth"] <= 0
        and keys["threads_growth"] <= 0
        and keys["processes_growth"] <= 0
    )


def config_copy(
    workload: str, model: str, out: Path, steps: int, episodes: int, max_tokens: int
) -> Path:
    """The workload as shipped on `model`, `steps` × `episodes`, each agent's max_tokens
    capped (a random tiny model rarely stops early: the cap is what sizes a step)."""
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
        sampling = agent.setdefault("sampling", {})
        sampling["max_tokens"] = min(sampling.get("max_tokens", max_tokens), max_tokens)
    data["run"] = {
        **data.get("run", {}),
        "steps": steps,
        "episodes_per_step": episodes,
        "micro_batches": 2,
        "mode": "flex",
    }
    path = out / f"{workload}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def trained_agents(cfg: Path) -> list[str]:
    data = yaml.safe_load(cfg.read_text())
    return sorted({n["agent"] for n in data["nodes"].values()})


def soak_workload(
    cfg: Path, run_dir: Path, warmup: int, scheduler: str | None = None
) -> dict[str, Any]:
    """One run on a fresh default cluster (or on the running one at `scheduler`), sampled
    per step."""
    from distributed import Client

    where = ClusterConfig(scheduler=scheduler) if scheduler else ClusterConfig()
    with dask_cluster(where) as workers, Client(workers.address) as client:
        sampler = StepSampler(run_dir, trained_agents(cfg), client)
        sampler.start()
        try:
            out = train_run(cfg, run_dir, workers.address)
        finally:
            samples = sampler.stop()
    cols = series(samples)
    steps = len(out["per_step"])
    walls = [r["wall_s"] for r in out["per_step"] if r["step"] >= warmup] or [0.0]
    return {
        "steps_run": steps,
        "sampled_steps": len(samples),
        "missed_steps": steps - len(samples),
        "step_s": round(statistics.median(walls), 3),
        "wall_s": round(out["wall_s"], 1),
        "violations": out["consistency"]["violations"],
        **summarize(cols, warmup),
        "by_warmup": by_warmup(cols, steps),
        "samples": cols,
    }


def by_warmup(cols: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """The keys for other warm-ups (how much of a figure is start-up still settling)."""
    out = {}
    for w in (20, 50, 100):
        if w < steps - 1:
            summary = summarize(cols, w)
            out[str(w)] = {k: summary[k] for k in KEYS}
    return out


def run(
    workloads: list[str],
    model: str,
    steps: int,
    warmup: int,
    episodes: int,
    max_tokens: int,
    work: Path,
    scheduler: str | None = None,
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "steps": steps,
        "warmup": warmup,
        "episodes_per_step": episodes,
        "max_tokens": max_tokens,
        "rss_target": RSS_TARGET,
        "workloads": {},
    }
    with prefect_api():
        results["server_pools"] = fill_server_pools()
        for wl in workloads:
            cfg = config_copy(wl, model, work, steps, episodes, max_tokens)
            run_dir = work / f"run-{wl}"
            results["workloads"][wl] = soak_workload(cfg, run_dir, warmup, scheduler)
    per = results["workloads"].values()
    for key in KEYS:
        results[key] = max(r[key] for r in per)
    results["soak_ok"] = all(r["soak_ok"] for r in per)
    return results


def plot(results: dict[str, Any], path: Path) -> None:
    """RSS, file descriptors and threads against the step, one line per process, one column
    per workload; the dashed line is the end of the warm-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(results["workloads"])
    rows = (("rss_mb", "RSS (MiB)"), ("fds", "file descriptors"), ("threads", "threads"))
    fig, axes = plt.subplots(
        len(rows), len(wls), figsize=(5.5 * len(wls), 8), squeeze=False, sharex="col"
    )
    for j, wl in enumerate(wls):
        cols = results["workloads"][wl]["samples"]
        for i, (metric, label) in enumerate(rows):
            ax = axes[i][j]
            for proc, c in cols["procs"].items():
                ax.plot(cols["steps"], c[metric], lw=1.2, label=proc)
            ax.axvline(results["warmup"] - 0.5, color="grey", ls="--", lw=0.8)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if metric == "rss_mb":
                ax.set_title(f"{wl}: {results['steps']} steps")
        axes[-1][j].set_xlabel("step")
        axes[0][j].legend(fontsize=7, loc="center right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render(results: dict[str, Any]) -> None:
    t = Table(
        title=f"soak: {results['steps']} steps × {results['episodes_per_step']} episodes, "
        f"growth after a {results['warmup']}-step warm-up"
    )
    cols = ("workload", "process", "RSS warm MiB", "RSS max growth", "RSS trend", "fds", "threads")
    for col in cols:
        t.add_column(col, justify="left" if col in ("workload", "process") else "right")
    for wl, r in results["workloads"].items():
        for proc, g in r["per_process"].items():
            rss, fds, th = g["rss_mb"], g["fds"], g["threads"]
            if rss is None:  # seen on one side of the warm-up only
                continue
            t.add_row(
                wl,
                proc + (" (restarted)" if g["restarted"] else ""),
                f"{rss['warm']:.0f}",
                f"{100 * rss['rel_max']:+.1f}%",
                f"{100 * rss['rel_trend']:+.1f}%",
                f"{fds['warm']:.0f} → {fds['last']:.0f}",
                f"{th['warm']:.0f} → {th['last']:.0f}",
            )
    Console(width=140).print(t)
    if pools := results.get("server_pools"):
        fills = ", ".join(f"{p['burst']}: {p['files']}/{p['threads']}" for p in pools)
        print(f"Prefect server pools filled first (burst: files/threads): {fills}")
    for wl, r in results["workloads"].items():
        print(
            f"{wl}: rss_growth_max {100 * r['rss_growth_max']:.1f}% (trend "
            f"{100 * r['rss_growth_trend']:.1f}%), open_files_growth {r['open_files_growth']}, "
            f"fds_growth {r['fds_growth']} (sockets {r['sockets_growth']}), "
            f"threads_growth {r['threads_growth']}, processes_growth "
            f"{r['processes_growth']}; step {r['step_s']:.2f} s, "
            f"{r['sampled_steps']}/{r['steps_run']} steps sampled, "
            f"{'ok' if r['soak_ok'] else 'GROWTH'}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="math-chain, 5 steps × 2, warm-up 2")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=50, help="steps before the reference sample")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--episodes", type=int, default=4, help="episodes per step")
    ap.add_argument("--max-tokens", type=int, default=8, help="cap of every agent's max_tokens")
    ap.add_argument("--model", default=None, help="HF model dir (default: a tiny random one)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="with --small: the run on the running Dask cluster at ADDRESS (default: a fresh one)",
    )
    a = ap.parse_args(argv)
    if a.scheduler is not None and not a.small:
        ap.error("--scheduler is for --small (a soak measures a fresh cluster)")
    if a.small:
        a.steps, a.warmup, a.workloads, a.episodes = 5, 2, "math-chain", 2
    workloads = a.workloads.split(",")
    if unknown := set(workloads) - set(BUILTIN):
        ap.error(f"unknown workloads {sorted(unknown)}")
    if not 0 < a.warmup < a.steps:
        ap.error("--warmup must be between 1 and --steps - 1")
    with tempfile.TemporaryDirectory(prefix="flexmarl-soak-") as tmp:
        model = a.model
        if model is None:
            from workloads.tiny_model import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny"))
        results = run(
            workloads, model, a.steps, a.warmup, a.episodes, a.max_tokens, Path(tmp), a.scheduler
        )
    render(results)
    if a.png:
        plot(results, a.png)
    if a.json:
        write_results(results, a.json)
    return results


if __name__ == "__main__":
    main()
