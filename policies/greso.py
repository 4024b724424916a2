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
from collections.abc import Mapping
from dataclasses import dataclass

from meg.policies import GresoSelect, keep_draw
from policies._history import HistorySelector, zero_variance_episodes
from policies.base import SELECTIONS, Selection, SelectRef
from storage.schema import SampleBatch
from workloads.datasets import Episode

log = logging.getLogger(__name__)


class GresoSelector(HistorySelector[GresoSelect]):
    """Plans which episodes of a step are rolled out; holds the per-task history."""

    def start(self) -> None:
        self.probability = Greso(self.policy).rollout_probability
        self.flags: dict[tuple[str, str], list[bool]] = defaultdict(list)

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

    def learn(self, step: int, batches: Mapping[str, SampleBatch]) -> None:
        """Add the zero-variance flags of `step`'s episodes."""
        for node, b in batches.items():
            for e, flat in zero_variance_episodes(b.episode, b.group_id, b.reward).items():
                task = self.task_of(e)
                if task is not None:
                    self.flags[(task, node)].append(flat)

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
                p = self.probability(self.streak(item.id))
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
        return kept_all, SelectRef(k, sum(map(len, planned)), {"skipped": tuple(skipped)})


@SELECTIONS.register("greso")
@dataclass(frozen=True)
class Greso(Selection[GresoSelect]):
    planner = GresoSelector

    def rollout_probability(self, streak: int) -> float:
        """Of a prompt whose `streak` most recent episodes taught nothing."""
        m = self.model
        return max(m.floor, m.explore ** min(streak, m.history))
