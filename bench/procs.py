"""Sampling every process of a run once per finished training step (`bench.soak`).

A thread of the driver watches the run's consumption log in the MEG Store: the optimizer
step of every agent writes `<run_dir>/store/<run>/<agent>/consumed/<step>.json`, so a step
is finished once all of them exist. Reading directory listings and psutil figures changes
nothing the run computes; there is no hook in the flow.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any


def process_sample(pid: int | None = None) -> dict[str, float]:
    """RSS (MiB), file descriptors, sockets, regular open files and threads of one process (default:
    the calling one, which is how `client.run` samples a worker)."""
    import psutil

    p = psutil.Process(pid)
    with p.oneshot():
        return {
            "pid": p.pid,
            "ppid": p.ppid(),
            "rss_mb": round(p.memory_info().rss / 2**20, 2),
            "fds": p.num_fds(),
            "sockets": len(p.net_connections(kind="inet")),
            "files": len(p.open_files()),
            "threads": p.num_threads(),
        }


def worker_sample(dask_worker: Any) -> dict[str, Any]:
    """`process_sample` of a Dask worker, with its name (`client.run` passes the worker)."""
    return {**process_sample(), "name": str(dask_worker.name)}


def _short(cmdline: list[str]) -> str:
    """`python -m tasks.reward_child` -> `reward_child`; else the program's name."""
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1].rsplit(".", 1)[-1]
    return Path(cmdline[0]).name if cmdline else "?"


def is_prefect_server(cmdline: list[str]) -> bool:
    """The local Prefect API server `flows.cluster.start.prefect_api` starts is a uvicorn child."""
    return any("uvicorn" in a for a in cmdline)


def prefect_server_pid() -> int | None:
    """The pid of the Prefect API server this process runs, if it runs one."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if is_prefect_server(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def sample_all(client: Any) -> dict[str, Any]:
    """One sample of every process of the run, by role: the driver (which also hosts the
    scheduler and the local cluster's nannies), the workers (by Dask name), the workers'
    own children (`rollout-0/reward_child#1`: the reward pool) and the Prefect API server if
    a child of this process runs it; `processes` counts every process of the tree."""
    import psutil

    procs = {"driver": process_sample()}
    workers = client.run(worker_sample)  # named by the worker itself: the scheduler's
    procs |= {s.pop("name"): s for s in workers.values()}  # listing once lacked them
    owner = {s["pid"]: name for name, s in procs.items() if name != "driver"}
    tree = psutil.Process().children(recursive=True)
    seen: dict[str, int] = {}
    for child in sorted(tree, key=lambda c: c.pid):
        try:
            cmd = child.cmdline()
            if child.pid in owner:
                continue
            if child.ppid() in owner:
                label = f"{owner[child.ppid()]}/{_short(cmd)}"
                seen[label] = seen.get(label, -1) + 1
                procs[f"{label}#{seen[label]}"] = process_sample(child.pid)
            elif is_prefect_server(cmd):
                procs["prefect-server"] = process_sample(child.pid)
        except psutil.Error:  # a process that ended between listing and reading
            continue
    return {"procs": procs, "processes": 1 + len(tree)}


def fill_server_pools(bursts: tuple[int, ...] = (1, 4, 16, 64)) -> list[dict[str, Any]]:
    """Drive the local Prefect server's pools to their bound before a soak; returns the
    server's sample before and after each burst of `n` concurrent API reads ([] when no
    local server runs).

    Why: the server opens pooled resources lazily, the first time that many requests
    overlap: SQLAlchemy's pool of SQLite connections (5, plus 10 overflow; each connection is
    a descriptor on the database and one on its WAL, plus an aiosqlite thread, and SQLite
    keeps a closed connection's descriptor for reuse while others hold locks on the file)
    and anyio's worker threads. In a run the first overlap of two more requests can come at
    any step (in the first fanout soak, step 80: +2 files, +1 thread), which is a pool
    reaching a high-water mark, not a leak. Filled first, any growth the soak then sees is
    one. The last two bursts agreeing shows the bound was reached.
    """
    import asyncio

    from prefect.client.orchestration import get_client

    pid = prefect_server_pid()
    if pid is None:
        return []

    async def burst(n: int) -> None:
        async with get_client() as client:
            await asyncio.gather(*(client.read_flow_runs(limit=5) for _ in range(n)))

    out = [{"burst": 0, **process_sample(pid)}]
    for n in bursts:
        asyncio.run(burst(n))
        out.append({"burst": n, **process_sample(pid)})
    return out


class StepSampler(threading.Thread):
    """Samples every process once per finished step (all `agents` have recorded it in the
    store's consumption log); see the module docstring."""

    def __init__(self, run_dir: Path, agents: list[str], client: Any, poll_s: float = 0.1):
        super().__init__(name="soak-sampler", daemon=True)
        self.run_dir, self.agents, self.client, self.poll_s = run_dir, agents, client, poll_s
        self.samples: list[dict[str, Any]] = []
        self.seen: set[int] = set()
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._t0 = time.time()

    def finished_steps(self) -> set[int]:
        done: set[int] | None = None
        for agent in self.agents:
            steps = {
                int(f.stem)
                for d in self.run_dir.glob(f"store/*/{agent}/consumed")
                for f in d.iterdir()
                if f.suffix == ".json" and f.stem.isdigit()
            }
            done = steps if done is None else done & steps
        return done or set()

    def poll(self) -> None:
        new = self.finished_steps() - self.seen
        if new:
            self.seen |= new
            sample = sample_all(self.client)
            t = round(time.time() - self._t0, 3)
            self.samples.append({"step": max(new), "t": t, **sample})

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self.poll_s):
                self.poll()
        except BaseException as e:  # reported by stop(): a soak without samples is no soak
            self.error = e

    def stop(self) -> list[dict[str, Any]]:
        self._stop_event.set()
        self.join()
        if self.error is not None:
            raise RuntimeError(f"the soak sampler failed: {self.error!r}") from self.error
        return sorted(self.samples, key=lambda s: s["step"])
