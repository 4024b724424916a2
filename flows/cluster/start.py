"""Bootstrap: one Prefect API server for the run, and the Dask cluster it runs on.

Prefect: with no `PREFECT_API_URL`, every process that talks to Prefect would start its own
temporary server (one per Dask worker, on one SQLite file: slow and "database is locked").
`prefect_api()` starts ONE server on 127.0.0.1 and exports its URL *before* the cluster is
created, so every worker process inherits it.

Dask: a `LocalCluster` (or `dask_cuda.LocalCUDACluster`, or any class by dotted name) with
one thread per worker process, bound to 127.0.0.1; or an existing scheduler address. Workers
are split into rollout and training roles by address; placement pins tasks to them.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engines.devices import ROLLOUT_GPU_SHARE
from flows.cluster.bootstrap import refuse_while_spawning, wait_for_local_workers
from flows.cluster.close import close_local

ROLLOUT, TRAIN = "rollout", "train"


class ClusterConfig(BaseModel):
    """Where the tasks run. Defaults: a local cluster, one rollout + one training worker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheduler: str | None = Field(
        None, description="tcp://HOST:PORT of an existing Dask scheduler to join"
    )
    rollout_workers: int = Field(
        1,
        ge=1,
        description="rollout workers of a local cluster. A run given no cluster setting lays "
        "its cluster out for its MEG and the machine (flows.cluster.layout; docs/clusters.md)",
    )
    train_workers: int = Field(1, ge=1, description="training workers of a local cluster")
    colocate: bool = Field(False, description="every worker does both rollout and training")
    cluster_class: str = Field(
        "distributed.LocalCluster",
        description="cluster class by dotted name (dask_cuda.LocalCUDACluster on GPU nodes)",
    )
    train_slots: int = Field(2, ge=1, description="training slots per training worker")
    rollout_gpu_share: float = Field(
        ROLLOUT_GPU_SHARE,
        gt=0,
        le=1,
        description="share of a GPU's memory a vLLM rollout engine takes (weights + KV "
        "cache); the rest is left to a trainer on the same GPU. 0.9 where training runs on "
        "other GPUs. Ignored on CPU workers",
    )
    memory_limit: str = Field(
        "auto",
        description="per-worker memory limit of a local cluster (auto: RAM / workers, or "
        "RAM / cores where the cores are fewer)",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads of each local worker (default 1: the workers share the "
        "cores; one colocated worker may take them all)",
    )
    cores: int | None = Field(
        None,
        ge=1,
        description="cores the layout a run chooses plans for (default: the cores this "
        "process may use; flows.cluster.layout)",
    )
    train_threads: int | None = Field(
        None,
        ge=1,
        description="torch threads of each local training worker (default: threads). An "
        "on-policy job's training waits for its rollout, so the trainer may take every core "
        "while one rollout worker per core generates (docs/peers.md)",
    )

    @model_validator(mode="after")
    def _train_threads_need_training_workers(self) -> ClusterConfig:
        if self.train_threads is not None and self.colocate:
            raise ValueError(
                "train_threads sets the threads of training workers, and a colocated "
                "cluster has none of its own: use threads"
            )
        return self

    def threads_of(self, role: str) -> int | None:
        """Torch threads of a local worker of `role` (None: Dask's one thread)."""
        return (self.train_threads or self.threads) if role == TRAIN else self.threads


@dataclass(frozen=True, slots=True)
class Workers:
    """Worker ids by role, and the Dask annotations that pin a task to each worker."""

    address: str  # scheduler
    rollout: tuple[str, ...]
    train: tuple[str, ...]
    pins: dict[str, dict[str, Any]]

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.rollout, *self.train)))

    def pin(self, worker: str) -> dict[str, Any]:
        return self.pins[worker]


# Dask's housekeeping timers, slowed down. With the defaults (event-loop tick every 20 ms,
# system monitor every 500 ms, worker memory monitor every 100 ms) an idle local cluster
# burns several times the CPU it does with these, which the run's own tasks get back
# (docs/clusters.md#2-start-the-scheduler-and-the-workers). What is lost: the dashboard's
# system plots update every 2 s, a stalled event loop is noticed within 0.5 s instead of
# 20 ms (it is reported only past 3 s anyway), and a worker over its memory limit
# is paused within 0.5 s.
QUIET_DASK = {
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "500ms",
}


def _settings_env() -> dict[str, str]:
    """Environment every process of the run shares (inherited by spawned workers)."""
    return {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no network here; the heartbeat failed
        "PREFECT_LOGGING_LEVEL": os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # Dask workers are daemons: no child processes
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "ERROR",
        # new worker processes only: silence third-party deprecation noise in run logs
        "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
        "DASK_LOGGING__DISTRIBUTED": "warning",
        # Dask's sampling profiler calls sys._current_frames(); on CPython 3.11 a GC pass
        # inside it (with distributed's GC diagnosis callback) deadlocked a worker here as
        # soon as another thread started (zarr's I/O pool). We do not need it.
        "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
        **QUIET_DASK,
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


def worker_env() -> dict[str, str]:
    """What a worker started by hand needs (`flexmarl worker`): the run settings above and
    one OpenMP thread (each worker runs one task at a time)."""
    return {**_settings_env(), "OMP_NUM_THREADS": "1"}


@contextmanager
def prefect_api() -> Iterator[str]:
    """Use `PREFECT_API_URL` if set, else run one local API server for the run's lifetime."""
    os.environ.update({k: v for k, v in _settings_env().items() if k not in os.environ})
    url = os.environ.get("PREFECT_API_URL")
    if url:
        yield url
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)  # send the last logs while the server is still up
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def warm_up() -> None:
    """Import what every task needs (torch, transformers, prefect, the project): seconds per
    process, paid in parallel at start-up instead of inside the first task of each worker."""
    import prefect  # noqa: F401
    import transformers  # noqa: F401

    import tasks.rollout
    import tasks.scoring
    import tasks.training  # noqa: F401


def _import(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import cluster class {dotted!r}: {e}") from None


def roles(cfg: ClusterConfig) -> dict[str, dict[str, float]]:
    """Worker name → Dask resources: its role(s) plus one resource named after itself.

    Placement pins a task with the worker's own resource, a *hard* restriction: a worker that
    dies is restarted by its nanny with the same name and resources (at a new address) and
    the task runs there. We avoid `workers=[addr], allow_other_workers=True`: Dask's work
    stealing and fallback then ignore resource restrictions, and a generate task can land on
    a training worker (seen here with distributed 2026.8)."""
    names = (
        [f"worker-{i}" for i in range(cfg.rollout_workers)]
        if cfg.colocate
        else [f"rollout-{i}" for i in range(cfg.rollout_workers)]
        + [f"train-{i}" for i in range(cfg.train_workers)]
    )
    out: dict[str, dict[str, float]] = {}
    for name in names:
        res = {ROLLOUT: 1.0, TRAIN: 1.0} if cfg.colocate else {name.split("-")[0]: 1.0}
        out[name] = {**res, name: 1.0}
    return out


def split_workers(info: dict[str, dict[str, Any]], scheduler: str) -> Workers:
    """Roles and pins from the workers' declared resources. Workers of a local cluster pin
    by their own resource; workers of a foreign cluster pin by address."""
    by_name = {str(w.get("name")): (a, w.get("resources", {})) for a, w in info.items()}
    rollout = tuple(sorted(n for n, (_, r) in by_name.items() if ROLLOUT in r))
    train = tuple(sorted(n for n, (_, r) in by_name.items() if TRAIN in r))
    pins = {
        n: ({"resources": {n: 1}} if n in r else {"workers": [a], "allow_other_workers": False})
        for n, (a, r) in by_name.items()
    }
    if not rollout or not train:
        raise ValueError(
            f"the Dask cluster needs workers with resource {ROLLOUT!r} and with {TRAIN!r} (found "
            f"{len(rollout)} and {len(train)} of {len(info)} workers); start them with "
            f"`dask worker SCHEDULER --nthreads 1 --resources {ROLLOUT}=1` (and {TRAIN}=1)"
        )
    return Workers(scheduler, rollout, train, pins)


def auto_memory_limit(ram: int, workers: int, cores: int) -> int:
    """Each local worker's memory limit under `memory_limit: auto`: the machine's memory
    shared by its workers, or by its cores where they are fewer. Dask's own "auto" for a
    one-thread worker is RAM / cores whatever the workers: on 16 cores a training worker of
    a two-worker cluster was capped at 1/16 of the RAM (and paused at 80% of that), while a
    run lays out at most a worker per core plus its trainer. Limits are caps, not
    reservations: their sum may exceed the RAM, as with Dask's."""
    return ram // max(1, min(workers, cores))


def _start_local(cfg: ClusterConfig) -> Any:
    """A LocalCluster-family cluster (any SpecCluster subclass) with one worker per role."""
    from dask.system import CPU_COUNT
    from distributed.system import MEMORY_LIMIT

    cls = _import(cfg.cluster_class)
    workers = roles(cfg)
    kwargs: dict[str, Any] = {
        "n_workers": 0,
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": "127.0.0.1:0",  # a free port: 8787 may be taken
        "memory_limit": (
            auto_memory_limit(MEMORY_LIMIT, len(workers), CPU_COUNT)
            if cfg.memory_limit == "auto"
            else cfg.memory_limit
        ),
    }
    if cfg.cluster_class.endswith("LocalCluster"):
        kwargs["host"] = "127.0.0.1"
    cluster = cls(**kwargs)
    for name, resources in workers.items():
        # the class's own spec for its next worker: dask-cuda's rotates CUDA_VISIBLE_DEVICES
        # there, so each worker sees its own GPU first (as cuda:0)
        ((_, template),) = cluster.new_worker_spec().items()
        spec = copy.deepcopy(template)
        spec["options"] = {**spec["options"], "resources": resources, "name": name}
        threads = cfg.threads_of(ROLLOUT if ROLLOUT in resources else TRAIN)  # colocated: rollout
        if threads:
            spec["options"]["env"] = {**spec["options"].get("env", {}), **thread_env(threads)}
        cluster.worker_spec[name] = spec
    cluster.scale(len(cluster.worker_spec))
    return cluster


def wait_for_roles(client: Any, address: str, timeout: float) -> Workers:
    """The cluster's roles once it has a rollout and a training worker: one colocated worker
    is enough (a one-agent job on one machine), so a joined cluster is waited for by role,
    not by a worker count. Past `timeout`, `split_workers`' error names what is missing."""
    deadline = time.monotonic() + timeout
    while True:
        info = client.scheduler_info(n_workers=-1)["workers"]
        try:
            return split_workers(info, address)
        except ValueError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def thread_env(threads: int) -> dict[str, str]:
    """The nanny environment that gives a worker's torch `threads` threads. Both variables:
    Dask's nanny sets OMP_NUM_THREADS and MKL_NUM_THREADS to 1 for every worker it spawns
    (its pre-spawn environment), and torch built with MKL takes its count from MKL's, so
    OMP_NUM_THREADS alone left every worker on one thread. A nanny's own `env` is applied
    in the worker process before torch loads, over the pre-spawn values, restarts included."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


# Dask's nanny exports this to every worker process it spawns (distributed.yaml); None drops it
NANNY_MALLOC_TRIM = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"


def keep_malloc_defaults() -> None:
    """Spawn local workers with glibc's own malloc thresholds, not Dask's
    `MALLOC_TRIM_THRESHOLD_=65536`.

    Why: setting any glibc malloc threshold turns off its dynamic mmap threshold, so every
    tensor above 128 KiB is a fresh `mmap` (page faults, zeroed pages) and goes back to the
    OS when freed. Torch on CPU allocates and frees activations of that size all the time:
    with Dask's setting a training micro-batch of the tiny model took about twice as long
    (docs/peers.md, "Where our step went, and what changed"; docs/clusters.md). Dask
    sets it so that freed memory shows up as freed at once; glibc's default still trims
    the heap top and returns large blocks, with the threshold following the block sizes in
    use. An explicit `MALLOC_TRIM_THRESHOLD_` in the driver's environment still reaches
    the workers (they inherit it): set it to get Dask's behaviour back."""
    import dask

    dask.config.set({NANNY_MALLOC_TRIM: None})


@contextmanager
def dask_cluster(cfg: ClusterConfig) -> Iterator[Workers]:
    """Start (or join) the cluster and yield the worker roles; closes what it started."""
    from distributed import Client

    from flows.cluster.threads import TorchThreads

    refuse_while_spawning("a Dask cluster")
    os.environ.update({k: v for k, v in _settings_env().items() if k not in os.environ})
    # this process's dask config was read at import, before the lines above, and a local
    # cluster's nannies hand it to their workers, over the workers' own environment: apply
    # the DASK_* settings here too (else every worker kept Dask's profiler running, whose
    # history grew ~1.6 MB a step for 17 minutes; bench/soak.py)
    import dask

    env = {k: v for k, v in os.environ.items() if k.startswith("DASK_")}
    dask.config.update(dask.config.config, dask.config.collect_env(env))
    # the scheduler of a local cluster lives in this process: quiet its INFO lines too
    logging.getLogger("distributed").setLevel(logging.WARNING)
    cluster = None
    if cfg.scheduler:
        address, expected = cfg.scheduler, 1  # then both roles: `wait_for_roles`
    else:  # one torch thread per worker (Dask's pre-spawn environment) unless set
        keep_malloc_defaults()
        cluster = _start_local(cfg)
        address, expected = cluster.scheduler_address, len(roles(cfg))
    try:
        with Client(address) as client:
            if cluster is not None:  # ours: stop waiting as soon as one failed to start
                wait_for_local_workers(cluster, client, expected, timeout=120)
            else:
                client.wait_for_workers(expected, timeout=120)
            workers = wait_for_roles(client, address, timeout=120)
            client.register_plugin(TorchThreads())  # before any task imports torch's pool
            client.run(warm_up)  # all workers import the stack at once, not in the first task
        yield workers
    except BaseException:
        if cluster is not None:  # an error or Ctrl-C: Dask's own close, a slow worker killed
            cluster.close()  # 4 s in (nothing committed is lost), not a minute's grace
        raise
    else:
        if cluster is not None:
            close_local(cluster)
