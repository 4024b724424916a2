"""What every task of one run needs to know, as one small frozen, picklable value.

Tasks receive a `RunContext` and references; they never receive tensors or text. Anything
heavy (a store handle, a tokenizer, a model host, a trainer) is rebuilt or found in the
worker-local caches of `tasks.worker`, keyed by the context.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from typing import Any

from engines.devices import ROLLOUT_GPU_SHARE
from meg import MEGSpec
from meg.spec import RunSpec


@dataclass(frozen=True, slots=True)
class RunContext:
    """A run's identity (id, store), its resolved spec, and where its work runs.

    `spec.run` holds the run's settings after the command line's overrides, resolved once by
    `flows.runs.config.resolve` and written to `run.json`; the properties below read them
    from there, so there is exactly one copy of each.
    """

    run_id: str
    store_url: str
    spec: MEGSpec
    train_slots: int = 2
    storage_options: dict[str, Any] | None = None
    rollout_gpu_share: float = ROLLOUT_GPU_SHARE  # a vLLM engine's share of its GPU
    engine_slots: int = 0  # engines a rollout worker holds for the run at most (0: no bound)

    @property
    def engine_gpu_share(self) -> float:
        """One rollout engine's share of its GPU's memory: the run's share split among the
        engines a worker may hold. vLLM's `gpu_memory_utilization` is per engine and checked
        against the memory free when the engine starts: a second engine at the whole share
        beside the first and a trainer could not start."""
        return self.rollout_gpu_share / max(1, self.engine_slots)

    @property
    def run(self) -> RunSpec:
        return self.spec.run

    @property
    def mode(self) -> str:  # sync | flex | async
        return self.spec.run.mode

    @property
    def staleness(self) -> int:
        return self.spec.run.staleness if self.spec.run.mode == "async" else 0

    @property
    def seed(self) -> int:
        return self.spec.run.seed

    @property
    def steps(self) -> int:
        """Steps of the whole run: the last one is always checkpointed (final export)."""
        return self.spec.run.steps

    @property
    def checkpoint_every(self) -> int:
        return self.spec.run.checkpoint_every

    @property
    def keep_checkpoints(self) -> int:
        return self.spec.run.keep_checkpoints

    @property
    def last_step(self) -> int:
        return self.steps - 1

    def nodes_of(self, agent: str) -> list[str]:
        """The MEG's nodes that `agent` serves, in the MEG's order."""
        return [n for n, node in self.spec.nodes.items() if node.agent == agent]

    @property
    def state_url(self) -> str:
        """StateStore root: published weights, swapped-out trainer states, checkpoints."""
        return f"{self.store_url.rstrip('/')}/{self.run_id}/_state"

    def checkpoint_root(self, agent: str) -> str:
        return f"{self.store_url.rstrip('/')}/{self.run_id}/_checkpoints/{agent}"

    def __reduce__(self) -> tuple[Any, ...]:
        """Unpickled copies of one context are one object per process. Dask keeps the
        arguments of every task in a run's lineage (finished ones too, to recompute them),
        on the scheduler and on the workers: each task held its own copy of the whole MEG,
        ~45 KB, 33 copies a fanout step (bench/soak.py)."""
        return (_interned, tuple(getattr(self, f.name) for f in fields(self)))


_INTERNED: dict[str, RunContext] = {}  # run id -> this process's copy (a few runs at most)


def _interned(*values: Any) -> RunContext:
    ctx = RunContext(*values)
    held = _INTERNED.pop(ctx.run_id, None)
    ctx = held if held == ctx else ctx  # a resumed run may change its fields: then the new one
    _INTERNED[ctx.run_id] = ctx  # most recent last
    while len(_INTERNED) > 8:
        del _INTERNED[next(iter(_INTERNED))]
    return ctx


def worker_name() -> str:
    """This Dask worker's address (`local-<pid>` outside a worker): where a task ran."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except ValueError:  # not inside a Dask worker
        return f"local-{os.getpid()}"


# Phase names of timelines written before each task kind had one name (bench/results keeps
# some): read old files through this.
LEGACY_PHASES = {"train": "train_micro_batch", "step": "optimizer_step"}


@dataclass(frozen=True, slots=True)
class Timing:
    """One task run's interval on one worker: the pipeline timeline is made of these."""

    phase: str  # the task kind: generate | score | train_micro_batch | optimizer_step | hand_over
    agent: str
    step: int
    micro_batch: int
    worker: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class Stopwatch:
    phase: str
    agent: str
    step: int
    micro_batch: int = -1
    start: float = field(default_factory=time.time)

    def done(self) -> Timing:
        return Timing(
            self.phase,
            self.agent,
            self.step,
            self.micro_batch,
            worker_name(),
            self.start,
            time.time(),
        )
