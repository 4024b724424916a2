"""The coarse Prefect unit of the hybrid executor: one task run per training step, or per
run of short steps.

With tiny models a Prefect task run per node and micro-batch costs about as much as the
task's own body (bench/e2e.py; docs/benchmarks.md#end-to-end-modes-side-by-side). The
design says what to do then: a
Prefect task covers a coarser unit and the fine-grained dataflow runs as plain Dask futures
beneath it. `watch_steps` is that unit: submitted when step k is compiled, it waits until the
pipeline has collected every result of the step (a `StepLog`: results are fetched once, by
the driver), so its task run spans the step's real execution; its logs list every node of
every micro-batch (worker, rows, tokens, seconds) and its result is the step's summary. It
runs on the flow's own thread pool and never occupies a Dask worker.

Even one task run a step costs driver and server CPU that short steps feel
(docs/architecture.md#the-hybrid-executor). So a task run watches the steps the driver
submits within
`UNIT_SECONDS` of its first (`flows.orchestrator.futures.WatchUnit`): steps a second or more
apart keep a task run each, as before; 0.25 s steps are watched four to a run, which is
named after the first.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.orchestrator.futures import StepLog, WatchUnit
from tasks.refs import GenRef, HandOverRef, RewardSum, ScoreRef, StepRef, TrainRef


def describe(ref: Any) -> str:
    t = ref.timing
    where = f"{t.worker.replace('tcp://', '')} {t.seconds:.3f}s"
    if isinstance(ref, GenRef):
        return (
            f"generate {ref.node} mb={ref.micro_batch}: {ref.rows} rows, "
            f"{ref.decode_tokens} tokens, v{ref.versions}{' (resumed)' if ref.resumed else ''}"
            f" [{where}]"
        )
    if isinstance(ref, ScoreRef):
        rewards = ", ".join(f"{a} {r.mean:.3f}" for a, r in ref.agent_reward.items() if r.count)
        team = f"; team {ref.team.mean:.3f}" if ref.team.count else ""
        failed = "".join(f"; {n} failed ({a})" for a, n in ref.failed.items())
        return (
            f"score {'+'.join(ref.nodes)} mb={ref.micro_batch}: {rewards}{team}{failed} [{where}]"
        )
    if isinstance(ref, TrainRef):
        return (
            f"train {ref.agent} mb={ref.micro_batch}: {ref.rows} rows, loss {ref.loss:.4f} "
            f"[{where}]"
        )
    if isinstance(ref, StepRef):
        return (
            f"optimizer step {ref.agent}: version {ref.version}, loss {ref.loss:.4f}"
            f"{' (skipped)' if ref.skipped else ''} [{where}]"
        )
    if isinstance(ref, HandOverRef):
        return f"hand over {ref.agent} to {ref.target}: {ref.nbytes / 2**20:.1f} MiB [{where}]"
    return repr(ref)


UNIT_SECONDS = 1.0  # steps submitted within this of a task run's first share that task run


@task(name="step", task_run_name="step {step}", persist_result=False, cache_policy=NO_CACHE)
def watch_steps(step: int, unit: WatchUnit) -> list[dict[str, Any]]:
    """Watch the steps of `unit`, from `step` on, until the unit is closed and every step
    in it is watched; the summary of each."""
    summaries = []
    try:
        while (log := unit.next()) is not None:
            summaries.append(watch_one(log))
    finally:
        unit.close()  # a failed step: the driver opens a new unit for the next step
    return summaries


def watch_one(results: StepLog) -> dict[str, Any]:
    """Wait for every fine-grained task of a step; log each one; return the step summary."""
    step = results.step
    refs = results.wait()  # a failed task raises here and fails this run too
    # one log record per step (not per task): every record is an API call the server handles
    lines = [describe(ref) for ref in sorted(refs, key=lambda r: r.timing.start)]
    get_run_logger().info(f"step {step}: {len(refs)} tasks\n" + "\n".join(lines))
    team = sum((r.team for r in refs if isinstance(r, ScoreRef)), RewardSum())
    steps = [r for r in refs if isinstance(r, StepRef)]
    return {
        "step": step,
        "team_reward": team.mean,
        "versions": {s.agent: s.version for s in steps},
        "loss": {s.agent: s.loss for s in steps},
        "tasks": len(refs),
    }
