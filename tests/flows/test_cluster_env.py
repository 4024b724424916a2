"""What a local cluster's worker processes inherit (flows.cluster.start.dask_cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client
from distributed.nanny import _get_env_variables
from pydantic import ValidationError

from flows.cluster.start import keep_malloc_defaults

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _malloc_env() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")}


def test_workers_keep_glibc_malloc_defaults(cluster: str) -> None:
    """No worker gets Dask's MALLOC_TRIM_THRESHOLD_ (it halves torch's CPU speed there);
    the driver's own setting, if any, is what they inherit."""
    with Client(cluster) as client:
        seen = client.run(_malloc_env)
    assert len(seen) == 2
    for env in seen.values():
        assert env["MALLOC_TRIM_THRESHOLD_"] == os.environ.get("MALLOC_TRIM_THRESHOLD_")
        assert env["OMP_NUM_THREADS"] is not None  # Dask's pre-spawn value: one thread


def test_memory_limits_share_the_ram_between_the_workers(cluster: str) -> None:
    """`memory_limit: auto` gives each local worker RAM / workers, or RAM / cores where the
    cores are fewer (Dask's own auto is RAM / cores: 1/16 of the RAM on 16 cores, for a
    trainer too); an explicit limit is passed through."""
    from dask.system import CPU_COUNT
    from distributed.system import MEMORY_LIMIT

    from flows.cluster.start import ClusterConfig, auto_memory_limit, dask_cluster

    gib = 1 << 30
    assert auto_memory_limit(64 * gib, 2, 16) == 32 * gib  # the two-worker cluster
    assert auto_memory_limit(64 * gib, 6, 16) == 64 * gib // 6  # a laid-out team
    assert auto_memory_limit(24 * gib, 3, 2) == 12 * gib  # as Dask: fewer cores than workers
    with Client(cluster) as client:
        limits = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
    assert limits == [auto_memory_limit(MEMORY_LIMIT, 2, CPU_COUNT)] * 2
    own = ClusterConfig(colocate=True, memory_limit="1.5GiB")
    with dask_cluster(own) as workers, Client(workers.address) as client:
        (info,) = client.scheduler_info()["workers"].values()
    assert info["memory_limit"] == int(1.5 * gib)


def test_only_the_malloc_setting_leaves_the_nanny_environment() -> None:
    before = _get_env_variables("distributed.nanny.pre-spawn-environ")
    keep_malloc_defaults()
    after = _get_env_variables("distributed.nanny.pre-spawn-environ")
    assert "MALLOC_TRIM_THRESHOLD_" not in after
    assert after == {k: v for k, v in before.items() if k != "MALLOC_TRIM_THRESHOLD_"}


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def test_threads_reach_torch_and_one_colocated_worker_can_be_joined(cluster: str) -> None:
    """One torch thread per worker by default (the workers share the cores); `threads=N`
    gives each worker N, through both variables torch reads (flows.cluster.start.thread_env)."""
    from flows.cluster.start import ClusterConfig, dask_cluster

    with Client(cluster) as client:
        assert set(client.run(_torch_threads).values()) == {1}
    with dask_cluster(ClusterConfig(colocate=True, threads=3)) as workers:
        assert workers.rollout == workers.train == ("worker-0",)
        with Client(workers.address) as client:
            env = client.run(
                lambda: [os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")]
            )
            assert list(env.values()) == [["3", "3"]]
            # MKL caps its count at the cores there are
            assert list(client.run(_torch_threads).values()) == [min(3, os.cpu_count() or 1)]
        # a run joining it waits for both roles, not for two workers: one colocated is enough
        with dask_cluster(ClusterConfig(scheduler=workers.address)) as joined:
            assert joined.rollout == joined.train == ("worker-0",)


# a driver whose main module imports torch before it starts the cluster: Dask spawns the
# workers, a spawned process imports the main module before its nanny applies `env`, so
# their torch read the pre-spawn OMP_NUM_THREADS=1 (what `python -m bench.peer_trl` did)
TORCH_FIRST_DRIVER = """
import json, sys
import torch  # noqa: F401  (first, as a benchmark's main module does)
from distributed import Client
from flows.cluster.start import ClusterConfig, dask_cluster

def threads():
    import torch
    return torch.get_num_threads()

if __name__ == "__main__":
    with dask_cluster(ClusterConfig(train_threads=2)) as workers:
        with Client(workers.address) as client:
            names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
            # in a task, on the worker's task thread: where training runs
            seen = {a: client.submit(threads, workers=[a], pure=False).result() for a in names}
    json.dump({names[a]: n for a, n in seen.items()}, sys.stdout)
"""


def test_threads_reach_torch_when_the_driver_imported_it_first(tmp_path: Path) -> None:
    """`train_threads` gives the training worker its threads and leaves the rollout
    worker's at one, even when the driver's main module imported torch first
    (flows.cluster.threads.TorchThreads)."""
    script = tmp_path / "driver.py"
    script.write_text(TORCH_FIRST_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"rollout-0": 1, "train-0": min(2, len(os.sched_getaffinity(0)))}


def test_train_threads_config() -> None:
    from flows.cluster.start import ROLLOUT, TRAIN, ClusterConfig

    cfg = ClusterConfig(threads=3, train_threads=2)
    assert (cfg.threads_of(ROLLOUT), cfg.threads_of(TRAIN)) == (3, 2)
    assert ClusterConfig(threads=3).threads_of(TRAIN) == 3  # the default follows `threads`
    assert ClusterConfig().threads_of(TRAIN) is None  # Dask's one thread
    with pytest.raises(ValidationError, match="colocated cluster has none of its own"):
        ClusterConfig(colocate=True, train_threads=2)


def _visible() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_worker_gets_the_spec_the_cluster_class_makes_for_it() -> None:
    """dask-cuda gives each worker of a LocalCUDACluster its own GPU through the spec it makes
    for that worker; our roles and thread settings are added to that spec, not to a shared
    template (before, every worker got the first worker's GPU). No GPU here: a named fake
    of dask-cuda's rotation (tests/flows/fake_cuda_cluster.py)."""
    from flows.cluster.start import ClusterConfig, dask_cluster

    cfg = ClusterConfig(
        cluster_class="tests.flows.fake_cuda_cluster.FakeCUDACluster",
        rollout_workers=2,
        threads=1,
    )
    with dask_cluster(cfg) as workers, Client(workers.address) as client:
        seen = client.run(_visible)
        threads = client.run(_torch_threads)
    firsts = sorted(v.split(",")[0] for v in seen.values() if v)
    assert len(seen) == 3 and firsts == ["0", "1", "2"], seen  # one GPU first per worker
    assert set(threads.values()) == {1}  # the thread settings kept beside the GPU's
