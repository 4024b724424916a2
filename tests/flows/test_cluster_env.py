"""What a local cluster's worker processes inherit (flows.cluster.dask_cluster)."""

from __future__ import annotations

import os

import pytest
from distributed import Client
from distributed.nanny import _get_env_variables

from flows.cluster import keep_malloc_defaults

pytestmark = pytest.mark.slow


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
    gives each worker N, through both variables torch reads (flows.cluster.thread_env)."""
    from flows.cluster import ClusterConfig, dask_cluster

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
