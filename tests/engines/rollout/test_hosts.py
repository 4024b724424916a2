"""Model hosts: one load per (agent, process), version swaps only when older, crash re-creation."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from engines.rollout.base import BadRequestError, HostCrashedError, RolloutError, SamplingParams
from engines.rollout.hosts import drop_host, get_host, hosted_agents


def weights_of(model_dir: Path):
    """A picklable 'latest published weights' callable (what the StateStore will provide)."""
    return functools.partial(load_file, str(model_dir / "model.safetensors"))


def test_get_host_reuses_and_ensure_version_swaps_only_when_older(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    drop_host("solver")
    h = get_host("solver", "hf", str(tiny_model_dir))
    assert get_host("solver", "hf", str(tiny_model_dir)) is h
    assert h.loads == 1 and h.version == 0

    calls: list[int] = []

    def loader():
        calls.append(1)
        return weights_of(tiny_model_dir_b)()

    assert h.ensure_version(2, loader) is True
    assert h.version == 2 and hosted_agents()["solver"] == 2
    assert h.ensure_version(2, loader) is False
    assert h.ensure_version(1, loader) is False
    assert len(calls) == 1  # the loader is not even called when the host is up to date

    out = h.generate([[1, 5, 6]], SamplingParams(n=2, max_tokens=4, seed=0))
    assert len(out[0]) == 2 and h.outstanding_tokens == 0

    with pytest.raises(RolloutError, match="drop_host"):
        get_host("solver", "vllm", str(tiny_model_dir))
    assert drop_host("solver") is True and drop_host("solver") is False


def test_caller_errors_do_not_crash_host_but_failures_recreate_it(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    drop_host("verifier")
    h = get_host("verifier", "hf", str(tiny_model_dir))
    h.ensure_version(3, weights_of(tiny_model_dir_b))
    with pytest.raises(BadRequestError):
        h.generate([[]], SamplingParams())
    assert not h.crashed

    h.backend.model = None  # type: ignore[attr-defined]  # break the backend for real
    with pytest.raises(HostCrashedError, match=r"verifier.*failed"):
        h.generate([[1, 2]], SamplingParams(max_tokens=2))
    assert h.crashed and h.outstanding_tokens == 0
    with pytest.raises(HostCrashedError):
        h.generate([[1, 2]], SamplingParams(max_tokens=2))

    h2 = get_host("verifier", "hf", str(tiny_model_dir))
    assert h2 is not h and h2.loads == 2
    assert h2.version == 3  # the latest weights were restored on re-creation
    assert len(h2.generate([[1, 2]], SamplingParams(max_tokens=2))[0]) == 1
    drop_host("verifier")


def test_a_dropped_host_serves_nothing_and_a_task_holding_it_retries(tiny_model_dir: Path) -> None:
    """A task of an old run may still hold its host when a new run drops it: it must get
    the retryable `HostCrashedError`, not a half-closed engine."""
    drop_host("old-run/solver")
    h = get_host("old-run/solver", "hf", str(tiny_model_dir))
    assert drop_host("old-run/solver") is True and "old-run/solver" not in hosted_agents()
    with pytest.raises(HostCrashedError, match="dropped"):
        h.generate([[1, 2]], SamplingParams(max_tokens=2))
    with pytest.raises(HostCrashedError, match="dropped"):
        h.ensure_version(1, weights_of(tiny_model_dir))
    fresh = get_host("old-run/solver", "hf", str(tiny_model_dir))
    assert fresh is not h and not fresh.crashed and fresh.loads == 1
    assert len(fresh.generate([[1, 2]], SamplingParams(max_tokens=2))[0]) == 1
    drop_host("old-run/solver")


# dashboard_address="127.0.0.1:0": the scheduler's health/metrics HTTP server binds a free
# loopback port at once.
# With None it tries 8787 first; when another cluster on this machine holds 8787, distributed
# warns and leaks the failed socket (an unraisable ResourceWarning that fails the test).
def test_tasks_on_one_worker_share_one_loaded_model(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    from distributed import Client, LocalCluster

    model, loader = str(tiny_model_dir), weights_of(tiny_model_dir_b)

    def task(version: int) -> tuple[int, int, int, int, int]:
        # a closure ships by value, but get_host lives in an importable module: the
        # registry is the worker's, not the task's
        from engines.rollout.hosts import get_host

        host = get_host("solver", "hf", model)
        swapped = host.ensure_version(version, loader)
        host.generate([[1, 5]], SamplingParams(max_tokens=3, seed=0))
        return os.getpid(), id(host.backend), host.loads, host.version, int(swapped)

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        a = client.submit(task, 1, pure=False).result()
        b = client.submit(task, 1, pure=False).result()
        assert a[:2] == b[:2]  # same process, same backend object
        assert (a[2], a[3], a[4]) == (1, 1, 1) and (b[2], b[3], b[4]) == (1, 1, 0)

        client.restart()  # the worker process dies; a fresh one starts with no models
        c = client.submit(task, 1, pure=False).result()
        assert c[0] != a[0]
        assert (c[2], c[3], c[4]) == (1, 1, 1)  # reloaded once, latest weights re-applied


def test_adopt_host_hands_an_engine_to_the_next_run_reset_to_its_model(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    """What a long-lived worker does when a new run starts (tasks.worker.hand_over_hosts):
    the same engine, back to the model directory's weights, under the new run's key."""
    from engines.rollout.hosts import adopt_host

    model, params = str(tiny_model_dir), SamplingParams(n=2, max_tokens=6, seed=3)
    prompts = [[1, 40, 41], [1, 50]]
    for key in ("r1/solver", "r2/solver", "r3/solver"):
        drop_host(key)
    old = get_host("r1/solver", "hf", model)
    base = old.generate(prompts, params)
    old.ensure_version(4, weights_of(tiny_model_dir_b))
    assert old.generate(prompts, params) != base  # the run trained it elsewhere

    assert adopt_host("r1/solver", "r2/solver", "hf", model, dtype="bfloat16") is None
    assert adopt_host("missing/solver", "r2/solver", "hf", model) is None
    assert "r1/solver" in hosted_agents()  # a mismatch leaves the host where it was

    new = adopt_host("r1/solver", "r2/solver", "hf", model)
    assert new is not None and new.backend is old.backend and new.adopted
    assert new.version == 0 and new.latest is None
    assert hosted_agents().get("r1/solver") is None and hosted_agents()["r2/solver"] == 0
    assert new.generate(prompts, params) == base  # the model's own weights again
    with pytest.raises(HostCrashedError, match="dropped"):  # the old run's key serves nothing
        old.generate(prompts, params)
    assert new.ensure_version(1, weights_of(tiny_model_dir_b)) is True  # versions restart
    assert get_host("r2/solver", "hf", model) is new
    assert adopt_host("r2/solver", "r2/solver", "hf", model) is None  # the key is taken
    drop_host("r2/solver")


def test_make_room_drops_the_least_recently_used_idle_hosts_of_a_prefix(
    tiny_model_dir: Path,
) -> None:
    """A rollout worker's hosts of one run, bounded: the ones used longest ago go first, a
    host in the middle of a generate stays, and another run's hosts are not counted."""
    from engines.rollout.hosts import host_specs, make_room

    keys = ["room/a", "room/b", "room/c"]
    hosts = {k: get_host(k, "hf", str(tiny_model_dir)) for k in [*keys, "other/a"]}
    try:
        for k in ["room/b", "room/a", "room/c"]:  # b used longest ago, then a, then c
            hosts[k].generate([[1, 5]], SamplingParams(max_tokens=1, seed=0))
        assert make_room("room/", 3) == []
        assert make_room("room/", 2) == ["room/b"]
        with hosts["room/a"]._lock:  # a generate is running on a: it stays, c goes
            assert make_room("room/", 0) == ["room/c"]
        assert {k for k in host_specs() if k.startswith("room/")} == {"room/a"}
        assert "other/a" in host_specs() and hosts["room/c"].crashed
    finally:
        for k in hosts:
            drop_host(k)
