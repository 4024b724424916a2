"""The coarse Prefect unit of the hybrid executor: one task run per training step.

Measured here (bench/e2e.py, 2026-11-30): with tiny models a Prefect task run per node and
micro-batch cost 51–64% of the step time on 2 cores. DESIGN.md §4 says what to do then: a
Prefect task covers a coarser unit and the fine-grained dataflow runs as plain Dask futures
beneath it. `watch_step` is that unit: submitted when step k is compiled, it waits for the
step's futures, so its task run spans the step's real execution; its logs list every node
of every micro-batch (worker, rows, tokens, seconds) and its result is the step's summary.
It runs on the flow's own thread pool and never occupies a Dask worker.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from tasks.rollout import GenRef
from tasks.scoring import ScoreRef
from tasks.training import StepRef, TrainRef


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
        return f"score mb={ref.micro_batch}: team reward {ref.team_reward:.3f} [{where}]"
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
    return repr(ref)


@task(name="step", task_run_name="step {step}", persist_result=False)
def watch_step(step: int, futures: list[Any]) -> dict[str, Any]:
    """Wait for every fine-grained task of `step`; log each one; return the step summary."""
    from distributed import wait

    wait(futures)
    refs = [f.result() for f in futures]  # a failed task raises here and fails this run too
    log = get_run_logger()
    for ref in sorted(refs, key=lambda r: r.timing.start):
        log.info(describe(ref))
    scores = [r for r in refs if isinstance(r, ScoreRef)]
    steps = [r for r in refs if isinstance(r, StepRef)]
    return {
        "step": step,
        "team_reward": sum(s.team_reward for s in scores) / len(scores) if scores else None,
        "versions": {s.agent: s.version for s in steps},
        "loss": {s.agent: s.loss for s in steps},
        "tasks": len(refs),
    }
