"""A run on disk: its directory, its record (`run.json`), and where a resume starts.

The run directory holds `run.json` (everything needed to continue: the resolved MEG, mode,
sizes, store URL and run id), the plots, `summary.json` and the final HF exports. The data
itself lives in the MEG Store (by default `<run_dir>/store`), the states in its `_state` and
`_checkpoints` folders — so `--resume RUN_DIR` needs nothing else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.devices import ROLLOUT_GPU_SHARE
from engines.training.checkpoint_index import latest_checkpoint
from flows.config import validate_spec
from meg import MEGSpec
from storage.store import MEGStore
from tasks.context import RunContext


class RunError(ValueError):
    """A run directory cannot be used (not a run, or a conflicting one): a user error."""


@dataclass(frozen=True, slots=True)
class Run:
    dir: Path
    ctx: RunContext
    steps: int
    episodes_per_step: int
    micro_batches: int
    window: int
    balance: bool
    start_step: int = 0
    base_versions: dict[str, int] | None = None

    def record(self) -> dict[str, Any]:
        c = self.ctx
        return {
            "format": 1,
            "run_id": c.run_id,
            "store_url": c.store_url,
            "storage_options": c.storage_options,
            "spec": c.spec.model_dump(mode="json"),
            "mode": c.mode,
            "staleness": c.staleness,
            "seed": c.seed,
            "train_slots": c.train_slots,
            "rollout_gpu_share": c.rollout_gpu_share,
            "checkpoint_every": c.checkpoint_every,
            "keep_checkpoints": c.keep_checkpoints,
            "steps": self.steps,
            "episodes_per_step": self.episodes_per_step,
            "micro_batches": self.micro_batches,
            "window": self.window,
            "balance": self.balance,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "run.json").write_text(json.dumps(self.record(), indent=2))


def default_store(run_dir: Path) -> str:
    return (run_dir / "store").resolve().as_uri()


def load_run(run_dir: Path) -> Run:
    path = run_dir / "run.json"
    if not path.is_file():
        raise RunError(
            f"{run_dir} is not a flexmarl run directory (no run.json); pass the "
            "--run-dir of an earlier `flexmarl train`"
        )
    try:
        rec = json.loads(path.read_text())
        spec = validate_spec(MEGSpec.model_validate(rec["spec"]), str(path))
        ctx = RunContext(
            rec["run_id"],
            rec["store_url"],
            spec,
            rec["mode"],
            rec["staleness"],
            rec["seed"],
            rec["train_slots"],
            rec["checkpoint_every"],
            rec.get("storage_options"),
            rec.get("keep_checkpoints", 2),  # runs from before pruning existed: the default
            rec["steps"],
            rec.get("rollout_gpu_share", ROLLOUT_GPU_SHARE),  # runs from before: the default
        )
        return Run(
            run_dir,
            ctx,
            rec["steps"],
            rec["episodes_per_step"],
            rec["micro_batches"],
            rec["window"],
            rec["balance"],
        )
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise RunError(f"{path} is not a valid run record ({type(e).__name__}: {e})") from None


def _checkpointed_version(ctx: RunContext, agent: str) -> int:
    ckpt = latest_checkpoint(ctx.checkpoint_root(agent))
    return int(ckpt.rstrip("/").rsplit("/v", 1)[1]) if ckpt else 0


def resume_point(run: Run) -> Run:
    """The first step some agent has not finished (with its checkpoint), and each agent's
    policy version at that point. Later steps an agent already finished are skipped by the
    tasks themselves (they find the consumption record and the checkpoint)."""
    ctx = run.ctx
    store = MEGStore.open(ctx.store_url, ctx.run_id, storage_options=ctx.storage_options)
    done: dict[str, int] = {}
    logs: dict[str, dict[int, dict[str, Any]]] = {}
    for agent in {n.agent for n in ctx.spec.nodes.values()}:
        have = _checkpointed_version(ctx, agent)
        logs[agent] = store.table(agent).consumption_log()
        ok = [k for k, r in logs[agent].items() if int(r["extra"]["version_after"]) <= have]
        done[agent] = max(ok, default=-1)
    start = min(done.values(), default=-1) + 1
    base = {
        a: int(logs[a][start - 1]["extra"]["version_after"]) if start - 1 in logs[a] else 0
        for a in done
    }
    return Run(
        run.dir,
        ctx,
        run.steps,
        run.episodes_per_step,
        run.micro_batches,
        run.window,
        run.balance,
        start,
        base,
    )
