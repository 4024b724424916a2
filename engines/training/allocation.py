"""Elastic training allocation: which worker trains each weight unit, re-decided between steps.

A pure policy object (no Dask, no torch), like the rollout balancer: the orchestrator feeds it
the measured seconds of every finished task and asks it, when it submits a step's training,
where each unit trains. `FixedAllocation` is the default (each unit on one sticky training
worker, round-robin in need order); `ElasticAllocator` moves units.

The signal is measured: per step, each worker's *busy seconds* (every task that ran on it:
generate, score, train) and each unit's *training seconds* (its micro-batches and optimizer
step), each an exponential moving average over steps. A worker runs one task at a time, so a
step cannot complete faster than its busiest worker works: the busiest worker's seconds are
what a move must cut. After each step the allocator tries the one move of one unit to another
worker that most lowers the busiest worker's modelled seconds (a unit's seconds leave its
worker and land on the other), and only if it lowers them by at least `min_gain` (a move costs
a state handover). The candidate workers are the training workers and, elastically, the
rollout workers: a rollout worker whose rollout leaves it idle half of a step takes the
training of a light agent while the training worker is the bottleneck — capacity moves
between the roles, in whole units.

A model is a model: it ignores when in a step the work falls (a rollout worker that trains
may delay the next step's rollout). So a move is on trial, like a balancer split: the mean
step interval (the time between the last optimizer steps of consecutive steps) of the first
`trial_steps` steps placed on it, handover included, must beat the mean interval of the steps
before it, or the unit goes back and that move is never tried again.

Step 0 loads models and builds trainers: it is left out of the estimates (`warmup_steps`), as
is a moved unit's first step on its new worker (the trainer is built there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    ema: float = 0.5  # weight of the newest step in the estimates
    min_gain: float = 0.1  # move only if the busiest worker's modelled seconds drop 10%
    trial_steps: int = 2  # steps a move is measured on before it is kept
    warmup_steps: int = 1  # first steps left out of the estimates (model loads)

    def __post_init__(self) -> None:
        if not 0 < self.ema <= 1:
            raise ValueError(f"AllocatorConfig.ema must be in (0, 1], got {self.ema}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"AllocatorConfig.min_gain must be in [0, 1), got {self.min_gain}")
        if self.trial_steps < 1 or self.warmup_steps < 0:
            raise ValueError("AllocatorConfig.trial_steps must be >= 1, warmup_steps >= 0")


@dataclass(frozen=True, slots=True)
class Move:
    unit: str
    source: str
    target: str


class Allocation(Protocol):
    def worker_of(self, unit: str, step: int) -> str: ...
    def observe(self, worker: str, unit: str | None, seconds: float, step: int) -> None: ...
    def end_step(self, step: int, end: float) -> Move | None: ...


def round_robin(units: Sequence[str], workers: Sequence[str]) -> dict[str, str]:
    """Unit i trains on worker i mod W: the fixed placement."""
    if not workers:
        raise ValueError("need at least one training worker")
    return {u: workers[i % len(workers)] for i, u in enumerate(units)}


class FixedAllocation:
    """Each unit on one sticky training worker for the whole run (the default)."""

    def __init__(self, units: Sequence[str], train_workers: Sequence[str]) -> None:
        self.assignment = round_robin(units, train_workers)

    def worker_of(self, unit: str, step: int) -> str:
        return self.assignment[unit]

    def observe(self, worker: str, unit: str | None, seconds: float, step: int) -> None:
        pass

    def end_step(self, step: int, end: float) -> Move | None:
        return None


def best_move(
    assignment: dict[str, str],
    load: dict[str, float],
    demand: dict[str, float],
    workers: Sequence[str],
    refused: set[tuple[str, str]],
) -> tuple[Move, float] | None:
    """The move of one unit to another worker that gives the lowest busiest-worker load,
    with that load; None when no move is allowed. Pure."""
    best: tuple[Move, float] | None = None
    for unit, source in assignment.items():
        for target in workers:
            if target == source or (unit, target) in refused:
                continue
            new = {w: load.get(w, 0.0) for w in workers}
            new[source] -= demand.get(unit, 0.0)
            new[target] += demand.get(unit, 0.0)
            peak = max(new.values())
            if best is None or peak < best[1]:
                best = (Move(unit, source, target), peak)
    return best


def ema(old: float | None, now: float, a: float) -> float:
    return now if old is None else a * now + (1 - a) * old


@dataclass(slots=True)
class Trial:
    """A move on probation: the mean step interval before it and the intervals since."""

    move: Move
    baseline: float
    first_step: int  # the first step whose training was placed after the move
    intervals: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _StepLoad:
    busy: dict[str, float] = field(default_factory=dict)  # worker → seconds of its tasks
    train: dict[str, float] = field(default_factory=dict)  # unit → its training seconds


class ElasticAllocator:
    """Moves units between workers from measured load, one move at a time, each on trial."""

    def __init__(
        self,
        units: Sequence[str],
        train_workers: Sequence[str],
        spare_workers: Sequence[str] = (),
        config: AllocatorConfig | None = None,
    ) -> None:
        """`spare_workers`: other workers that may also train (the rollout workers)."""
        self.config = config or AllocatorConfig()
        self.assignment = round_robin(units, train_workers)
        self.workers = tuple(dict.fromkeys((*train_workers, *spare_workers)))
        self.load: dict[str, float] = {}  # worker → EMA of busy seconds per step
        self.demand: dict[str, float] = {}  # unit → EMA of training seconds per step
        self.trial: Trial | None = None
        self.refused: set[tuple[str, str]] = set()  # (unit, target) measured worse
        self.moves: list[tuple[int, Move]] = []  # (first step placed on it, move), reverts too
        self.reverts = 0
        self._steps: dict[int, _StepLoad] = {}
        self._ends: dict[int, float] = {}  # step → when its last optimizer step ended
        self._changed = False  # the assignment changed since the last step was placed
        self._arrived: dict[str, int] = {}  # unit → first step on its current worker

    def worker_of(self, unit: str, step: int) -> str:
        """Where `unit` trains in `step` (asked as the step's training is submitted)."""
        if self._changed:  # the first step placed on the new assignment
            self._changed = False
            if self.trial is not None and self.trial.first_step < 0:
                self.trial.first_step = step
            last = self.moves[-1][1]
            self.moves[-1] = (step, last)
            self._arrived[last.unit] = step
        return self.assignment[unit]

    def observe(self, worker: str, unit: str | None, seconds: float, step: int) -> None:
        """A task of `step` ran `seconds` on `worker`; `unit` is set for training tasks."""
        s = self._steps.setdefault(step, _StepLoad())
        s.busy[worker] = s.busy.get(worker, 0.0) + seconds
        if unit is not None:
            s.train[unit] = s.train.get(unit, 0.0) + seconds

    def end_step(self, step: int, end: float) -> Move | None:
        """Every task of `step` is in (its last optimizer step ended at `end`): fold it into
        the estimates, judge a move on trial, and maybe move a unit. Returns the move made
        (a revert included), which applies from the next step placed."""
        self._ends[step] = end
        self._fold(step, self._steps.pop(step, _StepLoad()))
        if self.trial is not None:
            return self._judge(step)
        if step + 1 < self.config.warmup_steps + 2 or not self.load:
            return None  # no interval measured after the warm-up yet
        found = best_move(self.assignment, self.load, self.demand, self.workers, self.refused)
        if found is None or found[1] > (1 - self.config.min_gain) * max(self.load.values()):
            return None
        move = found[0]
        self.trial = Trial(move, self._mean_interval(step), -1)
        return self._apply(move)

    # ---- internals ----------------------------------------------------------------------
    def _fold(self, step: int, s: _StepLoad) -> None:
        if step < self.config.warmup_steps:
            return
        a = self.config.ema
        for w in self.workers:
            self.load[w] = ema(self.load.get(w), s.busy.get(w, 0.0), a)
        for unit, seconds in s.train.items():
            if self._arrived.get(unit) != step:  # a first step on a new worker builds it
                self.demand[unit] = ema(self.demand.get(unit), seconds, a)

    def _interval(self, step: int) -> float | None:
        if step - 1 in self._ends and step - 1 >= self.config.warmup_steps:
            return self._ends[step] - self._ends[step - 1]
        return None

    def _mean_interval(self, step: int) -> float:
        """Mean of the last `trial_steps` measured step intervals up to `step`."""
        found = [self._interval(k) for k in range(step - self.config.trial_steps + 1, step + 1)]
        values = [v for v in found if v is not None]
        return sum(values) / len(values) if values else float("inf")

    def _judge(self, step: int) -> Move | None:
        trial = self.trial
        assert trial is not None
        if trial.first_step < 0 or step < trial.first_step:
            return None  # steps placed before the move are still finishing
        interval = self._interval(step)
        if interval is not None:
            trial.intervals.append(interval)
        if len(trial.intervals) < self.config.trial_steps:
            return None
        self.trial = None
        if sum(trial.intervals) / len(trial.intervals) < trial.baseline:
            return None  # kept
        m = trial.move
        self.refused.add((m.unit, m.target))
        self.reverts += 1
        return self._apply(Move(m.unit, m.target, m.source))

    def _apply(self, move: Move) -> Move:
        self.assignment[move.unit] = move.target
        self.moves.append((-1, move))
        self._changed = True
        return move
