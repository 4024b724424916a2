"""Worker-local state (`tasks.worker`): a run's rollout host, built once per worker process,
and the seconds its start took, which the rollout balancer leaves out."""

from __future__ import annotations

from collections.abc import Callable

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
