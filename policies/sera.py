"""SERA on the driver (`select: {policy: sera}`): how many episodes each prompt of a
micro-batch gets, from its estimated success rate (Scale-Equalized Rollout Allocation,
Chen et al. 2026, arXiv 2609.36552).

The budget is the micro-batch's E planned episodes; they are divided among its first
⌈E / base⌉ planned prompts, so a prompt gets `base` episodes (`base · n` root samples) on
average, from none to `max_episodes`. To compare with a fixed group size G at the same
budget, set the root's `n` to G / base and multiply `episodes_per_step` by `base`: the same
prompts and samples per step, spread unevenly.

With a fixed group size n, a prompt's group teaches nothing unless its rewards differ, and
how likely that is depends on the prompt: a prompt solved once in ten needs far more samples
than a coin flip for its group to hold a success. SERA spends a fixed budget (here: the
micro-batch's planned episodes) so that this chance, the *attenuation* κ(p, N) of prompt p's
gradient at N samples, is as equal as the budget allows across prompts — a max–min
allocation, solved exactly in whole episodes by water-filling: every active prompt starts at
one episode, and each further episode goes to the prompt whose κ is lowest.

- κ follows the root agent's advantage estimator (`KAPPA`): for `maxrl` (the paper's
  estimator, A = (r − r̄)/r̄) a group's gradient is attenuated by 1 − (1 − p)^(N−1); for the
  group-normalized ones (grpo, rloo, ...) by the chance that a group is mixed,
  1 − p^N − (1 − p)^N.
- p is a Beta(prior, prior) posterior mean of the prompt's root rewards (clipped to [0, 1]);
  each time a prompt comes back, its earlier counts keep `discount` of their weight.
  A prompt never seen gets the prior's mean.
- The active set (as the paper's default): a prompt whose group, even at `max_episodes`,
  would be mixed with less than `min_mixed` chance gets no episode (near-certain successes
  and failures); if that leaves too few prompts to spend the budget, the most promising
  ones are kept.
- A prompt with k episodes is one advantage group over its k·n root samples, advantages
  scaled by base/k (`tasks.scoring`: the paper's multiplicity correction N0/N_q, so a
  prompt weighs as one group of the mean size however many samples it got).

Determinism, as for GRESO (`policies.greso`): step k is allocated from the history of the
steps up to k − window, read in step order; a resumed run re-plans to the same choices.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meg import MEGSpec
from meg.policies import SeraSelect
from meg.registry import Registry
from policies._history import HistorySelector
from policies.base import SELECTIONS, Problem, Selection, SelectRef
from storage.schema import SampleBatch
from workloads.datasets import Episode

log = logging.getLogger(__name__)

Kappa = Callable[[float, int], float]  # (success rate, samples) → attenuation in [0, 1]


def mixed_chance(p: float, samples: int) -> float:
    """The chance that `samples` 0/1 rewards of success rate p are not all equal."""
    return 1.0 - p**samples - (1.0 - p) ** samples


def maxrl_kappa(p: float, samples: int) -> float:
    """Centered MaxRL's attenuation at N samples: 1 − (1 − p)^(N−1)."""
    return 1.0 - (1.0 - p) ** max(samples - 1, 0)


KAPPA: dict[str, Kappa] = {"maxrl": maxrl_kappa}  # every other estimator: `mixed_chance`


def allocate(
    rates: Sequence[float],
    slots: int,
    n: int,
    max_episodes: int,
    min_mixed: float,
    kappa: Kappa = mixed_chance,
) -> list[int]:
    """Episodes per prompt (in the order of `rates`), summing to `slots` (at most
    `len(rates) * max_episodes`). Pure.

    Active: the prompts whose group at `max_episodes · n` samples is mixed with chance >=
    `min_mixed`, at least ceil(slots / max_episodes) of them (the most mixed first). Each
    active prompt gets one episode; the rest go one at a time to the active prompt with the
    lowest κ that is below `max_episodes` (ties: the earlier prompt)."""
    if slots <= 0 or not rates:
        return [0] * len(rates)
    top = max_episodes * n
    order = sorted(range(len(rates)), key=lambda q: -mixed_chance(rates[q], top))  # stable
    active = [q for q in order if mixed_chance(rates[q], top) >= min_mixed]
    need = min(math.ceil(slots / max_episodes), len(rates), slots)
    if len(active) < need:
        active = order[:need]
    active = sorted(active[:slots])  # the most mixed, if more than the slots
    units = [0] * len(rates)
    for q in active:
        units[q] = 1
    for _ in range(slots - len(active)):
        open_ = [q for q in active if units[q] < max_episodes]
        if not open_:
            break
        q = min(open_, key=lambda q: (kappa(rates[q], units[q] * n), q))
        units[q] += 1
    return units


@dataclass(slots=True)
class Beta:
    """A prompt's success-rate posterior: Beta(a, b)."""

    a: float
    b: float

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)


def root_nodes(spec: MEGSpec) -> list[str]:
    """The nodes whose groups SERA sizes: no inputs (they see the task alone), a reward."""
    return [n for n, node in spec.nodes.items() if not node.inputs and n in spec.rewards]


class SeraSelector(HistorySelector[SeraSelect]):
    """Allocates each micro-batch's episodes to its prompts (a `policies.base.Selector`)."""

    def reads(self, spec: MEGSpec) -> list[str]:
        return root_nodes(spec)

    def start(self) -> None:
        spec = self.ctx.spec
        first = spec.nodes[self.nodes[0]] if self.nodes else None
        self.n = first.n if first else 1
        estimator = spec.agents[first.agent].loss.advantage if first else ""
        self.kappa = KAPPA.get(estimator, mixed_chance)
        self.beliefs: dict[str, Beta] = {}

    def rate(self, task: str) -> float:
        b = self.beliefs.get(task)
        return b.mean if b is not None else 0.5

    def learn(self, step: int, batches: Mapping[str, SampleBatch]) -> None:
        """Fold `step` into the beliefs: earlier counts keep `discount` of their weight."""
        prior, keep = self.policy.prior, self.policy.discount
        wins: dict[str, float] = defaultdict(float)
        rows: dict[str, int] = defaultdict(int)
        for b in batches.values():
            for e, r in zip(b.episode.tolist(), b.reward.tolist(), strict=True):
                task = self.task_of(e)
                if task is None or r != r:  # unknown episode, unscored (NaN) row
                    continue
                wins[task] += min(max(r, 0.0), 1.0)
                rows[task] += 1
        for task, count in rows.items():
            old = self.beliefs.get(task, Beta(prior, prior))
            self.beliefs[task] = Beta(
                prior + keep * (old.a - prior) + wins[task],
                prior + keep * (old.b - prior) + count - wins[task],
            )

    def select(
        self, k: int, planned: list[tuple[Episode, ...]]
    ) -> tuple[list[tuple[Episode, ...]], SelectRef]:
        self.ingest(k - self.window)
        out: list[tuple[Episode, ...]] = []
        skipped: list[str] = []
        repeated: list[str] = []
        for eps in planned:
            items = [item for _, item in eps[: math.ceil(len(eps) / self.policy.base)]]
            units = allocate(
                [self.rate(t.id) for t in items],
                len(eps),
                self.n,
                self.policy.max_episodes,
                self.policy.min_mixed,
                self.kappa,
            )
            spread = [t for t, u in zip(items, units, strict=True) for _ in range(u)]
            out.append(tuple((eid, t) for (eid, _), t in zip(eps, spread, strict=False)))
            skipped += [t.id for t, u in zip(items, units, strict=True) if u == 0]
            base = self.policy.base  # episodes beyond the mean: what difficulty moved
            repeated += [t.id for t, u in zip(items, units, strict=True) for _ in range(u - base)]
        if repeated:
            log.info(
                "step %d: %d prompts get no episode, %d episodes beyond the mean go to (%s)",
                k,
                len(skipped),
                len(repeated),
                ", ".join(sorted(set(repeated))[:8]),
            )
        prompts = sum(math.ceil(len(eps) / self.policy.base) for eps in planned)
        ref = SelectRef(k, prompts, {"skipped": tuple(skipped), "repeated": tuple(repeated)})
        return out, ref


@SELECTIONS.register("sera")
@dataclass(frozen=True)
class Sera(Selection[SeraSelect]):
    planner = SeraSelector

    @property
    def merges_groups(self) -> bool:
        return True

    @property
    def mean_episodes(self) -> int:
        return self.model.base

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        """SERA sizes the groups of the nodes that see the task alone from their rewards,
        and merges them across episodes, which a loop's turn credit (grouped by the root
        invocation) cannot take."""
        out: list[Problem] = []
        roots = [n for n, node in spec.nodes.items() if not node.inputs]
        if not any(n in spec.rewards for n in roots):
            out.append(
                (
                    "run.select",
                    "the sera selection policy sizes the groups of the nodes that see the task "
                    f"alone ({', '.join(roots)}) from their rewards, and none has a reward: "
                    "bind one under `rewards:`",
                )
            )
        if any(node.turn is not None for node in spec.nodes.values()):
            out.append(
                (
                    "run.select",
                    "the sera selection policy merges the groups of the root nodes across "
                    "episodes, and a loop's turn credit groups its rollouts by the root "
                    "invocation; use `select: {policy: all}` with loops",
                )
            )
        return out
