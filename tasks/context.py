"""What every task of one run needs to know, as one small frozen, picklable value.

Tasks receive a `RunContext` and references; they never receive tensors or text. Anything
heavy (a store handle, a tokenizer, a model host, a trainer) is rebuilt or found in the
worker-local caches of `tasks.worker`, keyed by the context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

from engines.devices import ROLLOUT_GPU_SHARE
from meg import MEGSpec


@dataclass(frozen=True, slots=True)
class RunContext:
    run_id: str
    store_url: str
    spec: MEGSpec
    mode: str = "flex"  # sync | flex | async
    staleness: int = 0
    seed: int = 0
    train_slots: int = 2
    checkpoint_every: int = 1
    storage_options: dict[str, Any] | None = None
    keep_checkpoints: int = 2
    steps: int = 0  # steps of the whole run: the last one is always checkpointed (final export)
    rollout_gpu_share: float = ROLLOUT_GPU_SHARE  # a vLLM engine's share of its GPU

    @property
    def last_step(self) -> int:
        return self.steps - 1

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


@dataclass(frozen=True, slots=True)
class Timing:
    """One task run's interval on one worker: the pipeline timeline is made of these."""

    phase: str  # generate | score | train | step
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
        from tasks.worker import worker_name

        return Timing(
            self.phase,
            self.agent,
            self.step,
            self.micro_batch,
            worker_name(),
            self.start,
            time.time(),
        )
