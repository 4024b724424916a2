"""The run's final policies as HF model directories (`RUN_DIR/final/<agent>/`, what
`flexmarl evaluate` and vLLM load), exported from each agent's newest checkpoint.

Where: a cluster the run started on this machine exports on its training worker, before the
cluster closes. That worker has torch and transformers imported already; the driver does not
(it never needs them: `tests/flows/test_executors.py`), and importing them there took most
of the time of the exports at the end of every run (docs/cli.md#what-a-run-writes). A
joined cluster's workers may live on other hosts, where the run directory is not: then the
driver exports, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.cluster.start import Workers
from flows.runs.record import Run
from tasks.context import RunContext


def export_agents(ctx: RunContext, out_dir: str, how: str = "adapter") -> list[str]:
    """Every agent's final policy under `out_dir/<agent>/`: a HF model directory, or for a
    LoRA agent its PEFT adapter (`how="merged"`: the merged model). Agents without a
    checkpoint (a run stopped before its first) are left out; returns the exported ones."""
    from engines.model_files import local_dir
    from engines.training.checkpoint import export_hf, restore_trainer
    from engines.training.checkpoint_index import latest_checkpoint

    done = []
    for agent in sorted({n.agent for n in ctx.spec.nodes.values()}):
        ckpt = latest_checkpoint(ctx.checkpoint_root(agent))
        if ckpt is None:
            continue
        model = local_dir(ctx.spec.agents[agent].model)
        trainer = restore_trainer(ckpt, model_path=model)
        try:
            export_hf(trainer, Path(out_dir) / agent, how=how)
        finally:
            trainer.close()
        done.append(agent)
    return done


def _on_worker(ctx: RunContext, out_dir: str, how: str) -> list[str]:
    """The worker's side: the run is over, so its resident trainers go first (their memory
    is the export's), then the export."""
    from tasks.worker import forget_other_runs

    forget_other_runs("")
    return export_agents(ctx, out_dir, how)


def export_final(run: Run, workers: Workers | None, how: str = "adapter") -> list[str]:
    """`run`'s final policies under `run.dir/final/`: on `workers`' first training worker
    (a cluster this run started here, still up), else (None) in this process."""
    out = str(run.dir / "final")
    if workers is None:
        return export_agents(run.ctx, out, how)
    from distributed import Client

    with Client(workers.address) as client:
        job: Any = client.submit(
            _on_worker, run.ctx, out, how, workers=[workers.train[0]], pure=False
        )
        return list(job.result())
