"""The cost model: how long each kind of task takes, from what it does and where it runs.

Two implementations of one protocol, chosen by device profile (`PROFILES`):

- `LinearCosts` (`cpu-here`): seconds fitted on this machine's runs as linear functions of
  the task's tokens (`calibration.LinearFit`); the worker processes share the machine's
  cores, which the executor models (`SimExecutor(cores=...)`).
- `RooflineCosts` (`acc-64g`): an inference replica's decode iteration reads the weights
  once and every running sequence's KV cache (memory-bound), prefill and training run at a
  fraction of peak FLOPs, state moves at link bandwidths. Decode time of one replica that
  serves sequences with prompts p_i and response lengths L_i:

      Σ_t iteration(t) = a·max_i L_i + c·Σ_i L_i + d·Σ_i (p_i·L_i + L_i²/2)

  with a = weight bytes / (tp·HBM·η), c = 2·params / (tp·FLOPs·MFU) per token and
  d = KV bytes per token / (tp·HBM·η): the first term is why one long response holds a
  whole batch (the long tail), the last why long contexts cost more than their tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.sim.calibration import (
    ACC_64G,
    CPU_HERE,
    EFFICIENCY,
    MODELS,
    TRAIN_FLOPS_PER_PARAM_TOKEN,
    Accelerator,
    Efficiency,
    LinearFit,
    ModelProfile,
)


class Costs(Protocol):
    """Seconds per task body; `accel`: the accelerators of the worker it runs on."""

    @property
    def dispatch_s(self) -> float: ...
    @property
    def cores(self) -> float | None: ...
    @property
    def accelerators(self) -> bool:
        """Utilization counts accelerator compute only (True: reward scoring, swaps and
        weight loads leave the accelerators idle), or every busy second (False: a CPU)."""
        ...

    def generate(
        self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int
    ) -> float: ...
    def generate_active(
        self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int
    ) -> float: ...
    def score(self, rows: int) -> float: ...
    def train(self, model: str, tokens: int, accel: int) -> float: ...
    def step(self, model: str, accel: int) -> float: ...
    def swap(self, model: str, accel: int) -> float: ...
    def load(self, model: str, accel: int) -> float: ...
    def switch(self, model: str, accel: int) -> float: ...


@dataclass(frozen=True, slots=True)
class LinearCosts:
    """This machine: one tiny model, every worker one process with one thread."""

    fit: LinearFit = CPU_HERE

    @property
    def dispatch_s(self) -> float:
        return self.fit.dispatch

    @property
    def cores(self) -> float | None:
        return self.fit.cores

    @property
    def accelerators(self) -> bool:
        return False

    def generate(self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int) -> float:
        f = self.fit
        longest = float(lengths.max(initial=0))
        return (
            f.gen_task
            + f.gen_iter * longest
            + f.gen_token * float(lengths.sum())
            + (f.gen_prompt * float(prompts.sum()))
        )

    def generate_active(
        self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int
    ) -> float:
        return 1.0  # one process, one thread: busy for the whole task

    def score(self, rows: int) -> float:
        return self.fit.score_task + self.fit.score_row * rows

    def train(self, model: str, tokens: int, accel: int) -> float:
        return self.fit.train_task + self.fit.train_token * tokens

    def step(self, model: str, accel: int) -> float:
        return self.fit.step_task

    def swap(self, model: str, accel: int) -> float:
        return self.fit.swap

    def load(self, model: str, accel: int) -> float:
        return 0.0  # a worker keeps one resident engine per weight unit (engines.rollout.hosts)

    def switch(self, model: str, accel: int) -> float:
        return 0.0  # colocated here: the engine and the trainer both stay in RAM


def replica_decode_s(
    m: ModelProfile, acc: Accelerator, eff: Efficiency, prompts: np.ndarray, lengths: np.ndarray
) -> float:
    """Prefill + decode of one tp-way replica serving these sequences (module docstring)."""
    if lengths.size == 0:
        return 0.0
    bw, flops = m.tp * acc.hbm_bps * eff.hbm, m.tp * acc.peak_flops
    a = m.weight_bytes / bw
    c = 2 * m.params / (flops * eff.prefill_mfu)
    d = m.kv_bytes_per_token / bw
    L = lengths.astype(np.float64)
    decode = a * L.max() + c * L.sum() + d * float((prompts * L + L * L / 2).sum())
    prefill = float(prompts.sum()) * 2 * m.params / (flops * eff.prefill_mfu)
    return prefill + decode


@dataclass(frozen=True, slots=True)
class RooflineCosts:
    """Accelerators: bandwidth- and FLOP-bound task bodies plus a per-task overhead that is
    our orchestrator's own, measured on this machine (`LinearFit` fixed terms)."""

    acc: Accelerator = ACC_64G
    eff: Efficiency = EFFICIENCY
    overhead: LinearFit = CPU_HERE

    @property
    def dispatch_s(self) -> float:
        return self.overhead.dispatch

    @property
    def accelerators(self) -> bool:
        return True

    @property
    def cores(self) -> float | None:
        return None  # every worker has accelerators of its own

    def _link(self, nbytes: float, accel: int, bps: float) -> float:
        return nbytes / (max(1, accel) * bps * self.eff.link)

    def generate(self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int) -> float:
        """Sequences spread round-robin over the worker's accel // tp replicas."""
        m = MODELS[model]
        r = max(1, accel // m.tp)
        slowest = max(
            replica_decode_s(m, self.acc, self.eff, prompts[i::r], lengths[i::r]) for i in range(r)
        )
        return self.overhead.gen_task + slowest

    def generate_active(
        self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int
    ) -> float:
        """The share of the worker's accelerators decoding, averaged over the task: a
        replica is active while it serves its sequences and idle after, or with none (the
        paper's utilization is this active time, not MFU)."""
        m = MODELS[model]
        r = max(1, accel // m.tp)
        busy = [
            replica_decode_s(m, self.acc, self.eff, prompts[i::r], lengths[i::r]) for i in range(r)
        ]
        total = self.overhead.gen_task + max(busy)
        return m.tp * sum(busy) / (accel * total) if total > 0 else 1.0

    def score(self, rows: int) -> float:
        return self.overhead.score_task + self.overhead.score_row * rows

    def train(self, model: str, tokens: int, accel: int) -> float:
        m = MODELS[model]
        flops = TRAIN_FLOPS_PER_PARAM_TOKEN * m.params * tokens
        return self.overhead.train_task + flops / (accel * self.acc.peak_flops * self.eff.train_mfu)

    def step(self, model: str, accel: int) -> float:
        """Adam update (reads and writes the sharded state once) + weight publication."""
        m = MODELS[model]
        update = 2 * m.train_state_bytes / (accel * self.acc.hbm_bps * self.eff.hbm)
        publish = m.weight_bytes / (self.acc.publish_bps * self.eff.link)
        return self.overhead.step_task + update + publish

    def swap(self, model: str, accel: int) -> float:
        """One direction of a training-slot swap: the sharded state over the host links."""
        return self._link(MODELS[model].train_state_bytes, accel, self.acc.host_bps)

    def load(self, model: str, accel: int) -> float:
        """A rollout instance takes another agent's weights (from host memory)."""
        return self._link(MODELS[model].weight_bytes, accel, self.acc.host_bps)

    def switch(self, model: str, accel: int) -> float:
        """A colocated worker changes role: offload one side's weights/state, load the
        other's (MARTI/OpenRLHF-style colocation with engine sleep and optimizer offload)."""
        m = MODELS[model]
        return self._link(m.weight_bytes + m.train_state_bytes, accel, self.acc.host_bps)


PROFILES: dict[str, Costs] = {"cpu-here": LinearCosts(), "acc-64g": RooflineCosts()}


def profile(name: str) -> Costs:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None
