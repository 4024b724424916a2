"""What the history-driven selection policies read back from the store: per episode,
whether it taught something (some rewarded node's group got more than one reward), its
mean reward and what it cost."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

import numpy as np

from meg import MEGSpec
from meg.policies import AllPrompts
from policies.base import RunView
from storage.schema import SampleBatch
from storage.store import MEGStore
from workloads.datasets import TaskItem

S = TypeVar("S", bound=AllPrompts)

ZERO_VARIANCE = 1e-6  # reward range below which a group taught nothing


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


def episode_rows(batches: Mapping[str, SampleBatch]) -> dict[str, tuple[bool, float, int]]:
    """Per episode of one step's `batches` (node → its rows): whether it was informative
    (some node's group got more than one reward), its mean reward over those rows, and the
    response tokens of those rows (what rolling it out cost)."""
    flat: dict[str, bool] = {}
    rewards: dict[str, list[float]] = defaultdict(list)
    tokens: dict[str, int] = defaultdict(int)
    for b in batches.values():
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


def rewarded_nodes(spec: MEGSpec) -> list[str]:
    return [n for n in spec.nodes if n in spec.rewards]


class HistorySelector(Generic[S]):
    """What every selector that plans from the run's history shares: its policy's model, the
    run it reads, the window (step k is planned from the steps up to k - window, read in
    step order, so a resumed run re-plans to the same choices), an episode's task and a
    task's item, the nodes it reads and the last step it learnt from. A subclass learns one
    step at a time (`learn`) and plans (`select`, `policies.base.Selector`)."""

    def __init__(
        self,
        policy: S,
        run: RunView,
        window: int,
        task_of: Callable[[str], str | None],
        item_of: Callable[[str], TaskItem],
    ) -> None:
        self.policy, self.ctx, self.window = policy, run, window
        self.task_of, self.item_of = task_of, item_of
        self.nodes = self.reads(run.spec)
        self.ingested = -1
        self.start()

    def start(self) -> None:
        """The subclass's own state, set up once the shared fields are."""

    def reads(self, spec: MEGSpec) -> list[str]:
        """The nodes whose rows it learns from (the rewarded ones)."""
        return rewarded_nodes(spec)

    def ingest(self, upto: int) -> None:
        """Learn from every step up to `upto` not read yet, in step order."""
        if upto <= self.ingested:
            return
        run = self.ctx
        st = MEGStore.open(run.store_url, run.run_id, storage_options=run.storage_options)
        for s in range(self.ingested + 1, upto + 1):
            tables = {n: st.table(run.spec.nodes[n].agent) for n in self.nodes}
            self.learn(s, {n: t.read(step=s, node=n) for n, t in tables.items()})
        self.ingested = upto

    def learn(self, step: int, batches: Mapping[str, SampleBatch]) -> None:
        raise NotImplementedError
