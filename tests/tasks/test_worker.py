"""Worker-local state (`tasks.worker`): a run's rollout host, built once per worker process,
the seconds its start took (which the rollout balancer leaves out), the engines a worker
holds at most, and their share of a GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from engines.rollout.hosts import drop_host, host_specs
from tasks.context import RunContext
from tasks.worker import host_of
from tests.tasks.conftest import math_chain


def test_the_engine_start_is_reported_by_the_call_that_paid_it(
    new_ctx: Callable[..., RunContext], tiny_model: str
) -> None:
    ctx = new_ctx(spec=math_chain(tiny_model, solver_only=True, backend="hf"))
    key = f"{ctx.run_id}/solver"
    try:
        host, startup = host_of(ctx, "solver")
        assert key in host_specs() and startup > 0
        again, warm = host_of(ctx, "solver")
        assert again is host and warm == 0.0
        drop_host(key)  # gone (a crash, a dropped worker's engine): the next call builds
        rebuilt, cold = host_of(ctx, "solver")
        assert rebuilt is not host and cold > 0
    finally:
        drop_host(key)


def test_a_worker_holds_at_most_its_engine_slots_of_a_run(
    new_ctx: Callable[..., RunContext], tiny_model: str
) -> None:
    """With one slot, the verifier's engine (the balancer moved a host to it) replaces the
    solver's, which nothing uses any more; with two, both stay."""
    spec = math_chain(tiny_model, backend="hf")
    for slots, kept in [(1, {"verifier"}), (2, {"solver", "verifier"})]:
        ctx = replace(new_ctx(f"slots{slots}", spec=spec), engine_slots=slots)
        try:
            host_of(ctx, "solver")
            host_of(ctx, "verifier")
            mine = {k.split("/")[-1] for k in host_specs() if k.startswith(f"{ctx.run_id}/")}
            assert mine == kept
        finally:
            for agent in ("solver", "verifier"):
                drop_host(f"{ctx.run_id}/{agent}")


@pytest.mark.parametrize(("slots", "share"), [(0, 0.45), (1, 0.45), (3, 0.15)])
def test_a_gpu_worker_splits_its_engine_share_among_its_slots(
    new_ctx: Callable[..., RunContext],
    tiny_model: str,
    monkeypatch: pytest.MonkeyPatch,
    slots: int,
    share: float,
) -> None:
    """vLLM sizes an engine from `gpu_memory_utilization`, its own share of the GPU: three
    engines at the run's 0.45 each would ask for 1.35 of it. A named fake of one visible
    GPU (torch's CUDA queries; nothing here runs on it): the options are all this checks."""
    import torch

    from meg.sharing import weight_units
    from tasks.worker import _host_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ctx = replace(new_ctx(spec=math_chain(tiny_model)), engine_slots=slots, rollout_gpu_share=0.45)
    _, backend, _, opts = _host_args(ctx, weight_units(ctx.spec)[0])
    assert backend == "vllm" and opts["gpu_memory_utilization"] == pytest.approx(share)
