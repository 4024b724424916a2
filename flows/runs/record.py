"""A run on disk: its directory, its record (`run.json`), and where a resume starts.

The run directory holds `run.json` (everything needed to continue: the run id, the store URL
and the resolved MEG, whose `run` section holds the run's settings after the command line's
overrides, with where each came from), the plots, `summary.json` and the final HF exports.
The data itself lives in the MEG Store (by default `<run_dir>/store`), the states in its
`_state` and `_checkpoints` folders — so `--resume RUN_DIR` needs nothing else.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engines.devices import ROLLOUT_GPU_SHARE
from engines.training.checkpoint_index import latest_checkpoint
from flows.runs.config import validate_spec
from meg import MEGSpec
from storage.store import MEGStore
from tasks.context import RunContext

FORMAT = 2
# Format 1 kept these run settings beside the spec (whose `run` then held the MEG's values).
_V1_SETTINGS = (
    "mode",
    "staleness",
    "seed",
    "checkpoint_every",
    "keep_checkpoints",
    "steps",
    "episodes_per_step",
    "micro_batches",
    "window",
    "balance",
)


class RunError(ValueError):
    """A run cannot be set up as asked (a bad override, not a run directory, a conflicting
    one): a user error, reported as one paragraph before anything starts."""


@dataclass(frozen=True, slots=True)
class Run:
    """A run directory and its resolved context; `start_step`/`base_versions` say where a
    resumed run goes on (0 and the initial policies for a new one)."""

    dir: Path
    ctx: RunContext
    sources: dict[str, str] = field(default_factory=dict)  # setting → cli|meg|default|auto|policy
    start_step: int = 0
    base_versions: dict[str, int] | None = None
    notes: tuple[str, ...] = ()  # what the run chose for the user (printed, not recorded)

    def record(self) -> dict[str, Any]:
        c = self.ctx
        return {
            "format": FORMAT,
            "run_id": c.run_id,
            "store_url": c.store_url,
            "storage_options": c.storage_options,
            "train_slots": c.train_slots,
            "rollout_gpu_share": c.rollout_gpu_share,
            "spec": c.spec.model_dump(mode="json"),
            "sources": self.sources,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def save(self) -> None:
        """Write run.json whole or not at all (a temporary file renamed over it): a run
        killed while writing it, or a reader polling it, never sees half a record, which
        `--resume` could not read."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / "run.json.tmp"
        tmp.write_text(json.dumps(self.record(), indent=2))
        os.replace(tmp, self.dir / "run.json")


def default_store(run_dir: Path) -> str:
    return (run_dir / "store").resolve().as_uri()


def already_a_run(run_dir: Path) -> None:
    if (run_dir / "run.json").exists():
        raise RunError(
            f"{run_dir} already holds a run; use --resume {run_dir} to continue "
            "it, or choose another --run-dir"
        )


def load_run(run_dir: Path) -> Run:
    path = run_dir / "run.json"
    if not path.is_file():
        raise RunError(
            f"{run_dir} is not a flexmarl run directory (no run.json); pass the "
            "--run-dir of an earlier `flexmarl train`"
        )
    try:
        rec = json.loads(path.read_text())
        data = rec["spec"]
        if rec.get("format", 1) == 1:
            data = {**data, "run": {**data.get("run", {}), **_v1_settings(rec)}}
        spec = validate_spec(MEGSpec.model_validate(data), str(path))
        ctx = RunContext(
            rec["run_id"],
            rec["store_url"],
            spec,
            rec["train_slots"],
            rec.get("storage_options"),
            rec.get("rollout_gpu_share", ROLLOUT_GPU_SHARE),  # runs from before: the default
        )
        return Run(run_dir, ctx, rec.get("sources", {}))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise RunError(f"{path} is not a valid run record ({type(e).__name__}: {e})") from None


def _v1_settings(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: rec[k] for k in _V1_SETTINGS if k in rec}
    out.setdefault("keep_checkpoints", 2)  # runs from before pruning existed: the default
    return out


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
    return replace(run, start_step=start, base_versions=base)
