"""Selective rollouts on the driver (`select: {policy: greso}`): which planned prompts of a
step are rolled out at all, from the store's own history.

Per task id and node, the history is whether each episode of that task had *zero reward
variance* at that node (every group of the node got one reward: zero advantage, zero
gradient). A task's `streak` is the smallest, over the nodes with a reward, of its trailing
run of such episodes; the policy rolls it out with probability `rollout_probability(streak)`
and skips it otherwise. A skipped prompt is not replaced: the step rolls out fewer episodes
(what saves tokens), and each micro-batch keeps at least one.

Determinism: step k is planned after `Pipeline.wait_window(k)`, which guarantees that every
step up to k - window is trained (hence scored). The history used for step k is exactly the
steps up to k - window, read in step order, and every draw is a pure function of (seed, step,
index) (`meg.policies.keep_draw`), so a resumed run re-plans its earlier steps to the same
episodes and continues with the same choices.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from meg.policies import keep_draw
from storage.store import MEGStore
from tasks.context import RunContext
from tasks.refs import Episode

log = logging.getLogger(__name__)

ZERO_VARIANCE = 1e-6  # reward range below which a group taught nothing


@dataclass(frozen=True, slots=True)
class SelectRef:
    """What selection did to one step (collected with the task results for the summary)."""

    step: int
    planned: int
    skipped: tuple[str, ...]  # task ids not rolled out
    replayed: tuple[str, ...] = ()  # task ids rolled out in their place (bandit)
    repeated: tuple[str, ...] = ()  # task ids given episodes beyond the mean, once each (sera)


def zero_variance_episodes(
    episode: np.ndarray, group: np.ndarray, reward: np.ndarray
) -> dict[str, bool]:
    """Per episode: True if every group of it got a single reward (NaN rows are ignored)."""
    by_group: dict[str, list[float]] = defaultdict(list)
    episode_of: dict[str, str] = {}
    for e, g, r in zip(episode.tolist(), group.tolist(), reward.tolist(), strict=True):
        if r == r:  # not NaN
            by_group[g].append(r)
            episode_of[g] = e
    out: dict[str, bool] = {}
    for g, rs in by_group.items():
        flat = max(rs) - min(rs) <= ZERO_VARIANCE
        e = episode_of[g]
        out[e] = out.get(e, True) and flat
    return out


def episode_rows(
    ctx: RunContext, nodes: list[str], step: int
) -> dict[str, tuple[bool, float, int]]:
    """Per episode of `step`, from the store: whether it was informative (some rewarded
    node's group got more than one reward), its mean reward over those nodes' rows, and the
    response tokens of those rows (what rolling it out cost)."""
    st = MEGStore.open(ctx.store_url, ctx.run_id, storage_options=ctx.storage_options)
    flat: dict[str, bool] = {}
    rewards: dict[str, list[float]] = defaultdict(list)
    tokens: dict[str, int] = defaultdict(int)
    for node in nodes:
        b = st.table(ctx.spec.nodes[node].agent).read(step=step, node=node)
        for e, f in zero_variance_episodes(b.episode, b.group_id, b.reward).items():
            flat[e] = flat.get(e, True) and f
        for e, r, n in zip(
            b.episode.tolist(), b.reward.tolist(), b.response_lengths.tolist(), strict=True
        ):
            tokens[e] += int(n)
            if r == r:
                rewards[e].append(r)
    return {
        e: (not f, float(np.mean(rewards[e])) if rewards[e] else 0.0, tokens[e])
        for e, f in flat.items()
    }


class Selector:
    """Plans which episodes of a step are rolled out; holds the per-task history."""

    def __init__(
        self,
        ctx: RunContext,
        window: int,
        task_of: Callable[[str], str | None],
        item_of: Callable[[str], Any] | None = None,
    ) -> None:
        self.ctx, self.window, self.task_of = ctx, window, task_of
        self.policy = ctx.spec.run.select
        self.nodes = [n for n in ctx.spec.nodes if n in ctx.spec.rewards]
        self.flags: dict[tuple[str, str], list[bool]] = defaultdict(list)
        self.ingested = -1

    def streak(self, task: str) -> int:
        runs = []
        for node in self.nodes:
            flags = self.flags.get((task, node), [])
            run = 0
            for f in reversed(flags):
                if not f:
                    break
                run += 1
            runs.append(run)
        return min(runs) if runs else 0

    def ingest(self, upto: int) -> None:
        """Add the zero-variance flags of every step up to `upto` not read yet."""
        if not self.policy.needs_history or upto <= self.ingested:
            return
        st = MEGStore.open(
            self.ctx.store_url, self.ctx.run_id, storage_options=self.ctx.storage_options
        )
        for s in range(self.ingested + 1, upto + 1):
            for node in self.nodes:
                b = st.table(self.ctx.spec.nodes[node].agent).read(step=s, node=node)
                for e, flat in zero_variance_episodes(b.episode, b.group_id, b.reward).items():
                    task = self.task_of(e)
                    if task is not None:
                        self.flags[(task, node)].append(flat)
        self.ingested = upto

    def select(
        self, k: int, planned: list[tuple[Episode, ...]]
    ) -> tuple[list[tuple[Episode, ...]], SelectRef]:
        """The episodes of each micro-batch that are rolled out at step k."""
        self.ingest(k - self.window)
        kept_all: list[tuple[Episode, ...]] = []
        skipped: list[str] = []
        for eps in planned:
            kept = []
            for eid, item in eps:
                p = self.policy.rollout_probability(self.streak(item.id))
                index = int(eid.rsplit("e", 1)[1])
                if keep_draw(self.ctx.seed, k, index) < p:
                    kept.append((eid, item))
                else:
                    skipped.append(item.id)
            if eps and not kept:  # every micro-batch keeps one episode: the first planned
                kept.append(eps[0])
                skipped.remove(eps[0][1].id)
            kept_all.append(tuple(kept))
        if skipped:
            log.info(
                "step %d: %d of %d prompts skipped (%s)",
                k,
                len(skipped),
                sum(map(len, planned)),
                ", ".join(skipped[:8]),
            )
        return kept_all, SelectRef(k, sum(map(len, planned)), tuple(skipped))
