"""Which episodes each step rolls out, per micro-batch: the rollout policy says how many a
micro-batch launches, the selection policy which of them are rolled out at all.

Micro-batch j of step k trains `quota_j` episodes, a contiguous share of `episodes_per_step`.
The rollout policy may launch more for that (`launched(quota_j)`: `april`); the selection
policy's selector then re-plans them from the run's history (`greso` drops prompts that
taught nothing, `bandit` re-spends the slots, `sera` re-divides them: `policies`). The
episodes are drawn by
`batch_for_step(seed, k)`, a pure function, so a resumed run plans the same episodes; with
`greso` the steps before the resume are re-planned first, from the same committed history, so
the choices after it are the same as an uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from functools import cached_property
from typing import Any

from engines.training.catalog import WHOLE_LOOP_CREDITS
from meg import MEGSpec, ScoreGroup, score_groups
from meg.loops import loop_nodes
from policies import rollout_policy, selection_policy
from tasks.context import RunContext
from tasks.refs import Episode, episode_id
from workloads.datasets import Splits, TaskItem, batch_for_step, load_dataset
from workloads.rewards import reward_reads


class EpisodePlanner:
    """The episodes of every step, planned once and remembered (a step is planned before its
    tasks are submitted, after `Pipeline.wait_window`, which selection's history relies on)."""

    def __init__(
        self,
        ctx: RunContext,
        episodes_per_step: int,
        micro_batches: int,
        window: int,
        start_step: int = 0,
        on_select: Callable[[Any], None] = lambda ref: None,
    ) -> None:
        self.ctx, self.total, self.m = ctx, episodes_per_step, micro_batches
        self.rollout, self.select = rollout_policy(ctx.spec), selection_policy(ctx.spec)
        self.carry_limit = ctx.spec.run.rollout.carry_limit
        self.on_select = on_select
        self._planned: dict[int, list[tuple[Episode, ...]]] = {}
        self._task_of: dict[str, str] = {}  # episode id → task id (selection history)
        self.selector = self.select.selector(ctx, window, self._task_of.get, self.item_of)
        if self.select.needs_history:  # re-plan the steps before a resume: same choices
            for s in range(start_step):
                self.planned(s)

    def planned(self, k: int) -> list[tuple[Episode, ...]]:
        """The new episodes step k launches, per micro-batch (whole episodes each)."""
        if k in self._planned:
            return self._planned[k]
        bounds = [round(i * self.total / self.m) for i in range(self.m + 1)]
        launch = [self.rollout.launched(bounds[j + 1] - bounds[j]) for j in range(self.m)]
        items = batch_for_step(self.splits, k, sum(launch), self.ctx.seed)
        eps = [(episode_id(k, i), t) for i, t in enumerate(items)]
        self._task_of.update((e, t.id) for e, t in eps)
        starts = [sum(launch[:j]) for j in range(self.m + 1)]
        mbs = [tuple(eps[starts[j] : starts[j + 1]]) for j in range(self.m)]
        if self.selector is not None:
            mbs, ref = self.selector.select(k, mbs)
            self._task_of.update((e, t.id) for eps in mbs for e, t in eps)  # replayed prompts
            self.on_select(ref)
        self._planned[k] = mbs
        return mbs

    def item_of(self, task: str) -> TaskItem:
        """The training task with id `task` (a bandit replays earlier prompts by id)."""
        return self._items[task]

    @cached_property
    def _items(self) -> dict[str, TaskItem]:
        return {t.id: t for t in self.splits.train}

    @cached_property
    def splits(self) -> Splits:
        """The dataset, loaded on first use (the driver has imported the MEG's plug-ins)."""
        return load_dataset(self.ctx.spec.dataset)

    def episodes(self, k: int) -> list[tuple[Episode, ...]]:
        """What step k's tasks get per micro-batch: its new episodes, and with `april` first
        those of the `max_carry` steps before, any of which the root may still be carrying
        (which ones, the root's task reads from the store)."""
        new = self.planned(k)
        if not self.carry_limit:
            return new
        back = range(max(0, k - self.carry_limit), k)
        return [tuple(e for s in back for e in self.planned(s)[j]) + new[j] for j in range(self.m)]


def scoring_plan(spec: MEGSpec) -> tuple[ScoreGroup, ...]:
    """The score groups of `spec`, from what each node's bound reward declares it reads."""
    reads: dict[str, Collection[str] | None] = {}
    for node, binding in spec.rewards.items():
        try:
            reads[node] = reward_reads(binding.fn, binding.params)
        except ValueError as e:
            raise ValueError(f"rewards.{node}: {e}") from None
    return score_groups(spec, with_loop_reads(spec, reads))


def with_loop_reads(
    spec: MEGSpec, reads: Mapping[str, Collection[str] | None]
) -> dict[str, Collection[str] | None]:
    """`reads`, where a loop round whose agent's credit spans the loop (`episode`, `crbc`)
    also reads every node of its loop: its advantage needs all rounds and observations."""
    out = dict(reads)
    for node, ns in spec.nodes.items():
        turn = ns.turn
        if (
            turn is None
            or ns.is_tool
            or spec.agents[ns.agent].loss.credit not in WHOLE_LOOP_CREDITS
        ):
            continue
        if node in out and out[node] is None:
            continue  # reads the whole episode already
        whole = [n for n in loop_nodes(spec, turn.loop) if n != node]
        out[node] = [*(out.get(node) or ()), *whole]
    return out
