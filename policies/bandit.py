"""A contextual rollout bandit on the driver (`select: {policy: bandit}`): which prompts a
step spends its rollouts on, learnt from the store's own history.

The arm is a prompt; its context, what the run has seen of it (`features`): how often its
episodes were *informative* (some rewarded node's group got more than one reward: a
non-zero advantage, a gradient), its mean reward and how often it was seen. The payoff of
rolling a prompt out is whether the episode was informative. A LinUCB (ridge regression of
payoff on context, plus an uncertainty bonus `alpha · sqrt(xᵀA⁻¹x)`), divided by the
prompt's expected tokens (payoff per token: the long prompts are not free), scores every
candidate: the step's planned prompts and the *replay pool* — earlier prompts that were
informative at least once. Each micro-batch rolls out its best-scored candidates, as many
as were planned, at most `replay` of them from the pool (a prompt at most once per step).
A replayed prompt is rolled out afresh by the current policy: what is replayed is the
prompt, never an old trajectory, so the consistency rule is untouched.

Determinism, as for GRESO (`policies.greso`): step k is chosen from the history of the steps
up to k - window, ingested in step order; ties keep the planned order. A resumed run
re-plans its earlier steps from the same committed history to the same choices.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from meg.policies import BanditSelect
from policies._history import HistorySelector, episode_rows
from policies.base import SELECTIONS, Selection, SelectRef
from storage.schema import SampleBatch
from workloads.datasets import Episode

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TaskStats:
    seen: int = 0
    informative: int = 0
    reward_sum: float = 0.0
    tokens: int = 0  # response tokens its episodes cost, summed


def features(s: TaskStats) -> np.ndarray:
    """The context of a prompt: [1, informative rate, mean reward, its square (both ends
    of the reward range are flat), 1/(1 + times seen)]; an unseen prompt is [1, 0, 0, 0, 1]."""
    rate = s.informative / s.seen if s.seen else 0.0
    mean = s.reward_sum / s.seen if s.seen else 0.0
    return np.array([1.0, rate, mean, mean * mean, 1.0 / (1.0 + s.seen)])


class LinUCB:
    """Ridge regression of payoff on context with an upper-confidence bonus (Li et al. 2010)."""

    def __init__(self, dim: int, ridge: float, alpha: float) -> None:
        self.a = ridge * np.eye(dim)
        self.b = np.zeros(dim)
        self.alpha = alpha

    def update(self, x: np.ndarray, payoff: float) -> None:
        self.a += np.outer(x, x)
        self.b += payoff * x

    def scores(self, xs: np.ndarray) -> np.ndarray:
        """(n, d) contexts → (n,) θᵀx + α·sqrt(xᵀA⁻¹x)."""
        inv = np.linalg.inv(self.a)
        theta = inv @ self.b
        bonus = np.sqrt(np.einsum("nd,de,ne->n", xs, inv, xs))
        return xs @ theta + self.alpha * bonus


def expected_cost(stats: list[TaskStats]) -> np.ndarray:
    """Expected tokens of an episode of each prompt: its own mean, or for a prompt never
    seen the mean over those seen (1 with no history). The bandit ranks by expected payoff
    per token: at the same episode count, a long prompt must teach more to be preferred."""
    seen = [st.tokens / st.seen for st in stats if st.seen]
    prior = float(np.mean(seen)) if seen else 1.0
    return np.array([max(st.tokens / st.seen if st.seen else prior, 1.0) for st in stats])


def choose(
    planned: list[str], pool: list[str], score: dict[str, float], replay: int
) -> list[tuple[int, str]]:
    """The micro-batch's rollouts: as many as `planned`, the best-scored of planned and
    pool, at most `replay` from the pool. Returns (slot, task) pairs: a planned task keeps
    its slot; a replayed one takes the slot of a planned task it displaced (in order)."""
    ranked = sorted(
        [(-score[t], 0, i, t) for i, t in enumerate(planned)]
        + [(-score[t], 1, i, t) for i, t in enumerate(pool)],
    )
    kept_planned: list[int] = []
    replayed: list[str] = []
    for _, from_pool, i, t in ranked:
        if len(kept_planned) + len(replayed) == len(planned):
            break
        if from_pool:
            if len(replayed) < replay:
                replayed.append(t)
        else:
            kept_planned.append(i)
    free = [i for i in range(len(planned)) if i not in kept_planned]
    return sorted([(i, planned[i]) for i in kept_planned] + list(zip(free, replayed, strict=False)))


class BanditSelector(HistorySelector[BanditSelect]):
    """Plans which prompts a step rolls out (a `policies.base.Selector`)."""

    def start(self) -> None:
        self.stats: dict[str, TaskStats] = {}
        self.ucb = LinUCB(len(features(TaskStats())), self.policy.ridge, self.policy.alpha)

    def learn(self, step: int, batches: Mapping[str, SampleBatch]) -> None:
        """Each episode's context (its prompt's stats before it) and payoff (informative or
        not), then its stats."""
        for episode, (informative, reward, tokens) in episode_rows(batches).items():
            task = self.task_of(episode)
            if task is None:
                continue
            st = self.stats.setdefault(task, TaskStats())
            self.ucb.update(features(st), float(informative))
            st.seen += 1
            st.informative += int(informative)
            st.reward_sum += reward
            st.tokens += tokens

    def select(
        self, k: int, planned: list[tuple[Episode, ...]]
    ) -> tuple[list[tuple[Episode, ...]], SelectRef]:
        self.ingest(k - self.window)
        if not self.stats:  # no history yet: the planned prompts as they are
            return planned, SelectRef(k, sum(map(len, planned)), {"skipped": (), "replayed": ()})
        in_step = {item.id for eps in planned for _, item in eps}
        pool = sorted(t for t, s in self.stats.items() if s.informative and t not in in_step)
        candidates = sorted(in_step) + pool
        stats = [self.stats.get(t, TaskStats()) for t in candidates]
        ucb = self.ucb.scores(np.stack([features(st) for st in stats]))
        score = dict(zip(candidates, (ucb / expected_cost(stats)).tolist(), strict=True))
        out, skipped, replayed = [], [], []
        for eps in planned:
            cap = int(self.policy.replay * len(eps))
            chosen = choose([item.id for _, item in eps], pool, score, cap)
            pool = [t for t in pool if t not in {t for _, t in chosen}]  # once per step
            kept = []
            for slot, task in chosen:
                eid, item = eps[slot]
                if task != item.id:
                    skipped.append(item.id)
                    replayed.append(task)
                    item = self.item_of(task)
                kept.append((eid, item))
            out.append(tuple(kept))
        if replayed:
            log.info(
                "step %d: %d planned prompts replaced by earlier informative ones (%s)",
                k,
                len(replayed),
                ", ".join(replayed[:8]),
            )
        counts = {"skipped": tuple(skipped), "replayed": tuple(replayed)}
        return out, SelectRef(k, sum(map(len, planned)), counts)


@SELECTIONS.register("bandit")
@dataclass(frozen=True)
class Bandit(Selection[BanditSelect]):
    planner = BanditSelector
