"""Where a CPU step's time goes: a fanout step's core-seconds by category.

    python -m bench.breakdown [--repeats R] [--steps N] [--episodes N] [--json PATH]
                              [--workload fanout] [--small] [--cut]

`--cut` also runs `flex-no-segment-cache`, interleaved with `flex`: the same run with the
store's segment cache off on the workers (`storage.table.SEGMENT_CACHE_BYTES = 0`), i.e. the
code before the cut this benchmark found (repeated reads of committed segments).

Runs `flex` on the shared two-worker cluster of `bench/e2e.py` (1 rollout + 1 training
worker, the e2e sizes: 6 steps × 32 episodes, 2 micro-batches) R times and attributes the
CPU time (not wall time) of the steady window (end of step 0 to the end of the run, as
`bench.e2e.steady_state`) to categories, per step:

* **inside tasks**: a Dask `WorkerPlugin` wraps, on the workers only, the task body
  (`run_task`) and the functions a task spends its time in (sampling, the prompts' token
  ids, the store's reads and commits, reward calls, forward/backward, the optimizer,
  publication, checkpoints, slot swaps) with `time.process_time` timers, each phase's time
  exclusive of the phases inside it. A worker runs one task at a time, so its process time
  over a phase is the phase's (its I/O threads' included, zarr's among them). Nothing of
  the product is changed: the timers exist only in a benchmark's workers (`PHASES`).
* **outside tasks**: a sampler thread reads the CPU times of every thread of this process
  (the driver: the orchestrator on the main thread, Dask's scheduler and client on their
  event loop, Prefect's client threads) and of every process below it (the workers, their
  reward processes, the Prefect API server) every `PERIOD` seconds.

A worker's CPU outside its task bodies is Dask's (its event loop: transfers, heartbeats,
(de)serialization); the in-task time not inside a named phase is the tasks' own Python
(planning, building rows, advantages: "task glue"). "unattributed" is what is left: the
driver's threads that are neither Dask's nor Prefect's nor the main thread, and processes
of the run that are none of the above.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from storage.table import SEGMENT_CACHE_BYTES

# (module, attribute, phase): what the workers' timers wrap. `run_task` is the task body
# (its exclusive time: "task glue"); the class methods cover every caller.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("flows.orchestrator.executors", "run_task", "task"),
    ("tasks.rollout", "sample", "sampling"),
    ("tasks.rollout", "ensure_weights", "weights_load"),
    ("tasks.rollout", "prompts_of", "tokenize"),
    ("tasks.scoring", "sample_view", "tokenize"),
    ("tasks.scoring", "call_rewards", "reward"),
    ("storage.table", "Table.read", "store_read"),
    ("storage.table", "Table.has_segment", "store_read"),
    ("storage.table", "Table.read_carry", "store_read"),
    ("storage.table", "Table.write_segment", "store_commit"),
    ("storage.table", "Table.record_consumption", "store_commit"),
    ("tasks.training", "accumulate_part", "forward_backward"),
    ("engines.training.trainer", "AgentTrainer.step", "optimizer"),
    ("tasks.training", "publish_weights", "publish"),
    ("tasks.training", "save_checkpoint", "checkpoint"),
    ("tasks.training", "maybe_checkpoint", "checkpoint"),
    ("tasks.training", "prune_checkpoints", "checkpoint"),
    ("tasks.training", "acquire", "slots"),
)

# phase or process-level source → the category it is reported under
CATEGORIES: dict[str, str] = {
    "sampling": "model: sampling",
    "forward_backward": "model: forward/backward",
    "optimizer": "model: optimizer step",
    "tokenize": "tokenization",
    "store_read": "store reads",
    "store_commit": "store commits",
    "reward": "reward scoring",
    "reward_processes": "reward scoring",
    "publish": "checkpoints + publication",
    "checkpoint": "checkpoints + publication",
    "weights_load": "checkpoints + publication",
    "slots": "training slots (acquire, swap)",
    "task": "task glue (Python in tasks)",
    "worker_outside_tasks": "Dask (workers' event loops, transfers)",
    "driver_dask": "Dask (scheduler + client)",
    "prefect_server": "Prefect (server + client)",
    "driver_prefect": "Prefect (server + client)",
    "driver_main": "driver main thread (orchestrator, flow engine)",
    "unattributed": "other / unattributed",
}
ORDER = tuple(dict.fromkeys(CATEGORIES.values()))
PERIOD = 0.2  # seconds between the sampler's reads
# --cut: the segment cache on and off (before the cut), interleaved
CUT_ARMS: dict[str, dict[str, Any]] = {
    "flex": {"mode": "flex"},
    "flex-no-segment-cache": {"mode": "flex", "segment_cache": 0},
}


# ---------------------------------------------------------------- worker side (the timers)


class _Phases:
    """This worker's phase timers: a stack per thread of [phase, inner seconds], and the
    finished tasks' records."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.records: list[dict[str, Any]] = []

    def stack(self) -> list[list[Any]]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
            self.local.acc = defaultdict(float)
        return self.local.stack

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = self.stack()
            if phase == "task":  # a task body: a fresh record
                self.local.acc = defaultdict(float)
                start = time.time()
            stack.append([phase, 0.0])
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - t0
                _, inner = stack.pop()
                self.local.acc[phase] += spent - inner  # exclusive of the phases inside
                if stack:
                    stack[-1][1] += spent
                if phase == "task":
                    self.records.append(
                        {
                            "kind": args[0] if args else kwargs.get("kind"),
                            "step": kwargs.get("step", -1),
                            "start": start,
                            "end": time.time(),
                            "pid": os.getpid(),
                            "cpu": dict(self.local.acc),
                        }
                    )

        wrapper.__wrapped_phase__ = fn  # type: ignore[attr-defined]
        return wrapper


_TIMERS = _Phases()


def install(phases: Iterable[tuple[str, str, str]] = PHASES) -> None:
    """Wrap every phase's function in this process (once: a second call is a no-op)."""
    for module, attr, phase in phases:
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if not hasattr(fn, "__wrapped_phase__"):
            setattr(owner, name, _TIMERS.timed(phase, fn))


def take_records() -> list[dict[str, Any]]:
    """This worker's task records since the last call (run on the workers: `client.run`)."""
    out, _TIMERS.records[:] = list(_TIMERS.records), []
    return out


def set_segment_cache(nbytes: int) -> None:
    """The segment cache's bound in this process (run on the workers: `client.run`),
    emptied so that each run starts cold."""
    from storage import table

    table.set_segment_cache(nbytes)


def phase_timers() -> Any:
    """The Dask worker plugin that installs the timers on every worker."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class PhaseTimers(WorkerPlugin):
        name = "bench-breakdown-phase-timers"

        def setup(self, worker: Any) -> None:
            from bench.breakdown import install

            install()

    return PhaseTimers()


# ---------------------------------------------------------------- driver side (the sampler)


def thread_source(name: str) -> str:
    """The category source of one of the driver's threads, by its name."""
    low = name.lower()
    if name == "MainThread":
        return "driver_main"
    if "io loop" in low or "dask" in low or "distributed" in low or "tcp-executor" in low:
        return "driver_dask"
    if "prefect" in low or "apilog" in low or "events" in low or "eventloop" in low:
        return "driver_prefect"
    if name in ("core-sampler", "breakdown-sampler"):
        return "bench"
    return "unattributed"


class CpuSampler:
    """Cumulative CPU seconds of every driver thread and every descendant process, read
    every `period` seconds: `(time, {key: seconds})` samples; a key is
    `(source, id)`. `workers`: worker pid → name (their children are reward processes)."""

    def __init__(self, workers: Mapping[int, str], period: float = PERIOD) -> None:
        import psutil

        self.psutil = psutil
        self.me = psutil.Process()
        self.workers = dict(workers)
        self.period = period
        self.samples: list[tuple[float, dict[tuple[str, int], float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="breakdown-sampler", daemon=True)

    def source_of(self, proc: Any) -> str:
        if proc.pid in self.workers:
            return f"worker:{self.workers[proc.pid]}"
        try:
            parent = proc.ppid()
            cmd = " ".join(proc.cmdline()).lower()
        except self.psutil.Error:
            return "unattributed"
        if parent in self.workers:
            return "reward_processes"
        if "uvicorn" in cmd or "prefect" in cmd:
            return "prefect_server"
        return "unattributed"

    def read(self) -> dict[tuple[str, int], float]:
        names = {t.native_id: t.name for t in threading.enumerate()}
        out: dict[tuple[str, int], float] = {}
        for t in self.me.threads():
            out[(thread_source(names.get(t.id, "?")), t.id)] = t.user_time + t.system_time
        for proc in self.me.children(recursive=True):
            try:
                c = proc.cpu_times()
                out[(self.source_of(proc), proc.pid)] = c.user + c.system
            except self.psutil.Error:
                continue
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.read()))
            self._stop.wait(self.period)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, begin: float, end: float) -> dict[str, float]:
        return window_cpu(self.samples, begin, end)


def window_cpu(
    samples: list[tuple[float, dict[tuple[str, int], float]]], begin: float, end: float
) -> dict[str, float]:
    """CPU seconds per source between `begin` and `end`: per key, its value at the last
    sample inside the window minus its value at the first (a key first seen inside the
    window, a thread or process started in it, counts from 0)."""
    inside = [s for t, s in samples if begin <= t <= end]
    out: dict[str, float] = defaultdict(float)
    if len(inside) < 2:
        return out
    seen: dict[tuple[str, int], float] = {}
    for s in inside:
        seen.update(s)  # a key's last value while it lived
    for key, value in seen.items():
        out[key[0]] += max(0.0, value - inside[0].get(key, 0.0))
    return dict(out)


# ---------------------------------------------------------------- attribution (pure)


def attribute(
    records: list[dict[str, Any]],
    processes: Mapping[str, float],
    begin: float,
    end: float,
    steps: int,
) -> dict[str, float]:
    """Core-seconds a step per category.

    `records`: per task, its `start` (wall) and `cpu` (phase → exclusive process seconds);
    tasks that started inside [begin, end] count. `processes`: CPU seconds over the same
    window per source (`worker:<name>` for a worker process, `reward_processes`,
    `prefect_server`, `driver_main`, `driver_dask`, `driver_prefect`, `bench`,
    `unattributed`). A worker's CPU beyond its tasks' is `worker_outside_tasks` (Dask);
    `bench` (this benchmark's own sampler) is left out. `steps`: how many steps the window
    holds."""
    totals: dict[str, float] = defaultdict(float)
    in_tasks: dict[int, float] = defaultdict(float)
    for r in records:
        if not begin <= r["start"] <= end:
            continue
        for phase, s in r["cpu"].items():
            totals[CATEGORIES[phase]] += s
            in_tasks[r["pid"]] += s
    workers = sum(v for k, v in processes.items() if k.startswith("worker:"))
    outside = max(0.0, workers - sum(in_tasks.values()))
    totals[CATEGORIES["worker_outside_tasks"]] += outside
    for source, s in processes.items():
        if source.startswith("worker:") or source == "bench":
            continue
        totals[CATEGORIES.get(source, CATEGORIES["unattributed"])] += s
    return {c: round(totals.get(c, 0.0) / steps, 4) for c in ORDER}


def summarize(per_repeat: list[dict[str, float]]) -> dict[str, Any]:
    """Median, min and max over repeats of each category and of the step's total, and each
    category's share of the median total."""
    cats = list(per_repeat[0])
    total = [sum(r.values()) for r in per_repeat]
    med_total = statistics.median(total)
    out: dict[str, Any] = {
        "total": {
            "median": round(med_total, 4),
            "min": round(min(total), 4),
            "max": round(max(total), 4),
        }
    }
    for c in cats:
        vals = [r[c] for r in per_repeat]
        med = statistics.median(vals)
        out[c] = {
            "median": round(med, 4),
            "min": round(min(vals), 4),
            "max": round(max(vals), 4),
            "share": round(med / med_total, 4) if med_total else 0.0,
        }
    return out


# ---------------------------------------------------------------- the benchmark


def window_of(run_dir: Path) -> tuple[float, float, int]:
    """[end of step 0, end of the run] from the run's timeline, and the steps it holds."""
    tasks = json.loads((run_dir / "timeline.json").read_text())
    begin = max(t["end"] for t in tasks if t["phase"] == "optimizer_step" and t["step"] == 0)
    end = max(t["end"] for t in tasks)
    return begin, end, max(t["step"] for t in tasks)


def run(
    workload: str,
    model: str,
    steps: int,
    episodes: int,
    repeats: int,
    work: Path,
    arms: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`arms` (name → `train` settings, default `{"flex": {"mode": "flex"}}`) run
    interleaved, R times each, on one shared cluster (`ClusterConfig()`). An arm's
    `segment_cache` (bytes) is set on the workers before its runs (`storage.table`'s
    `SEGMENT_CACHE_BYTES`; 0: off, the code before the cut)."""
    from distributed import Client

    from bench.breakdown import set_segment_cache  # by reference, also under `-m`
    from bench.breakdown import take_records as taken
    from bench.common import results_header, train_run
    from bench.e2e import config_copy, steady_state
    from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api

    arms = arms or {"flex": {"mode": "flex"}}
    per: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    step_s: dict[str, list[float]] = {a: [] for a in arms}
    cfg = config_copy(workload, model, work, steps, episodes)
    with prefect_api(), dask_cluster(ClusterConfig()) as cluster, Client(cluster.address) as c:
        c.register_plugin(phase_timers())
        pids = {pid: name for name, pid in c.run(os.getpid).items()}
        with CpuSampler(pids) as sampler:
            for r in range(repeats):
                for arm, params in arms.items():
                    run_dir = work / f"{workload}-{arm}-{r}"
                    c.run(taken)  # earlier runs' records
                    c.run(set_segment_cache, params.get("segment_cache", SEGMENT_CACHE_BYTES))
                    kw = {k: v for k, v in params.items() if k != "segment_cache"}
                    out = train_run(cfg, run_dir, cluster.address, **kw)
                    time.sleep(2 * PERIOD)  # a sample after the run's end
                    records = [x for rs in c.run(taken).values() for x in rs]
                    begin, end, last = window_of(run_dir)
                    cpu = sampler.window(begin, end)
                    per[arm].append(attribute(records, cpu, begin, end, last))
                    step_s[arm].append(steady_state(out, run_dir)["step_s"])
    return {
        **results_header(
            workload=workload,
            steps=steps,
            episodes_per_step=episodes,
            micro_batches=2,
            repeats=repeats,
            cluster="1 rollout + 1 training worker (ClusterConfig())",
        ),
        "arms": {
            arm: {
                "step_s_repeats": step_s[arm],
                "step_s": statistics.median(step_s[arm]),
                "core_s_per_step": summarize(per[arm]),
                "repeats": per[arm],
            }
            for arm in arms
        },
    }


def render(results: dict[str, Any]) -> None:
    con = Console()
    for arm, a in results["arms"].items():
        t = Table(
            title=f"{results['workload']} {arm}: core-seconds a step (steps ≥ 1), "
            f"median [min–max] of {results['repeats']} runs, step {a['step_s']:.2f} s"
        )
        for col in ("category", "core-s a step", "range", "share"):
            t.add_column(col, justify="left" if col == "category" else "right")
        cs = a["core_s_per_step"]
        for c in ORDER:
            v = cs[c]
            t.add_row(
                c, f"{v['median']:.3f}", f"{v['min']:.3f}–{v['max']:.3f}", f"{v['share']:.1%}"
            )
        tot = cs["total"]
        t.add_row("total", f"{tot['median']:.3f}", f"{tot['min']:.3f}–{tot['max']:.3f}", "")
        con.print(t)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.common import write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--json", type=Path, default=Path("bench/results/breakdown.json"))
    ap.add_argument("--workload", default="fanout")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--model", default="models/tiny-math")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cut", action="store_true", help="also run flex without the segment cache")
    a = ap.parse_args(argv)
    steps = a.steps or (3 if a.small else 6)
    episodes = a.episodes or (2 if a.small else 32)
    with tempfile.TemporaryDirectory() as tmp:
        arms = CUT_ARMS if a.cut else None
        results = run(a.workload, a.model, steps, episodes, a.repeats, Path(tmp), arms)
    render(results)
    write_results(results, a.json)
    return results


if __name__ == "__main__":
    main()
