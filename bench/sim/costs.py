"""The cost model: how long each kind of task takes, from what it does and where it runs.

Two implementations of one protocol, chosen by device profile (`PROFILES`):

- `LinearCosts` (`cpu-here`): seconds fitted on this machine's runs as linear functions of
  the task's tokens (`calibration.LinearFit`); the worker processes share the machine's
  cores, which the executor models (`SimExecutor(cores=...)`).
- `PhysicsCosts` (`acc-64g`, `physics.py`): the paper's accelerators, every task body
  bounded by bytes over the bandwidth of the device that moves them or FLOPs over its peak
  (decode reads the weights and the KV cache per iteration; training is ZeRO-3 data
  parallel capped by the sequences, with a communication floor; loads, wakes and swaps go
  over each device's own host link), for one system's `Schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.sim.calibration import CPU_HERE, LinearFit
from bench.sim.physics import PhysicsCosts


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
    def train(self, model: str, tokens: np.ndarray, accel: int) -> float:
        """`tokens`: prompt + response tokens of each sequence trained."""
        ...

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

    def train(self, model: str, tokens: np.ndarray, accel: int) -> float:
        return self.fit.train_task + self.fit.train_token * float(np.sum(tokens))

    def step(self, model: str, accel: int) -> float:
        return self.fit.step_task

    def swap(self, model: str, accel: int) -> float:
        return self.fit.swap

    def load(self, model: str, accel: int) -> float:
        return 0.0  # a worker keeps one resident engine per weight unit (engines.rollout.hosts)

    def switch(self, model: str, accel: int) -> float:
        return 0.0  # colocated here: the engine and the trainer both stay in RAM


PROFILES: dict[str, Costs] = {"cpu-here": LinearCosts(), "acc-64g": PhysicsCosts()}


def profile(name: str) -> Costs:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None
