"""The score task: rewards and group advantages for one score group of one (step, micro-batch).

A score group (`meg.score_groups`) is the set of nodes that can be scored at the same moment:
as soon as they and what their rewards read are generated. The task reads the committed rows
of the nodes the group's rewards see, rebuilds each episode as text, applies the registered
reward bound to each node of the group, turns rewards into advantages with the agent's
registered estimator (groups = one node invocation), and commits one score segment per node.
Rewards for a node with no binding are 0 (its agent then gets no signal).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from prefect import task

from engines.training.advantages import compute_advantages
from meg import MEGSpec, ScoreGroup, score_groups, sinks
from storage.schema import SampleBatch, SegmentKey
from tasks.context import RunContext, Stopwatch, Timing
from tasks.rollout import Episode
from tasks.worker import plugins_of, store_of, tokenizer_of
from workloads.rewards import EpisodeView, SampleView, get_reward, reward_reads


@dataclass(frozen=True, slots=True)
class RewardSum:
    """Sum and count of rewards: means that add up across score groups and micro-batches."""

    total: float = 0.0
    count: int = 0

    def __add__(self, other: RewardSum) -> RewardSum:
        return RewardSum(self.total + other.total, self.count + other.count)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class ScoreRef:
    step: int
    micro_batch: int
    nodes: tuple[str, ...]
    rows: int
    agent_reward: dict[str, RewardSum]
    team: RewardSum  # rewards of the team nodes among `nodes` (count 0: none of them)
    timing: Timing


def scoring_plan(spec: MEGSpec) -> tuple[ScoreGroup, ...]:
    """The score groups of `spec`, from what each node's bound reward declares it reads."""
    reads = {}
    for node, binding in spec.rewards.items():
        try:
            reads[node] = reward_reads(binding.fn, binding.params)
        except ValueError as e:
            raise ValueError(f"rewards.{node}: {e}") from None
    return score_groups(spec, reads)


def reward_rows(
    ctx: RunContext,
    batches: dict[str, SampleBatch],
    episodes: tuple[Episode, ...],
    nodes: tuple[str, ...],
) -> dict[str, np.ndarray]:
    """Reward per row of each of `nodes`, from the bound reward functions; the episode views
    hold every batch in `batches`."""
    spec = ctx.spec
    tasks = dict(episodes)
    views: dict[str, dict[str, SampleView]] = defaultdict(dict)
    for node, b in batches.items():
        tok = tokenizer_of(ctx, spec.nodes[node].agent)
        for i in range(len(b)):
            sid = str(b.sample_id[i])
            text = tok.decode(b.response(i).tolist(), skip_special_tokens=True)
            parents = tuple(p for p in str(b.parent_ids[i]).split(",") if p)
            views[str(b.episode[i])][sid] = SampleView(sid, node, text, parents)
    episode_views = {e: EpisodeView(v) for e, v in views.items()}
    out: dict[str, np.ndarray] = {}
    for node in nodes:
        b = batches[node]
        binding = spec.rewards.get(node)
        r = np.zeros(len(b), np.float32)
        if binding is not None:
            fn = get_reward(binding.fn)
            for i in range(len(b)):
                ep = str(b.episode[i])
                view = episode_views[ep]
                r[i] = fn(view.samples[str(b.sample_id[i])], view, tasks[ep], **binding.params)
        out[node] = r
    return out


def advantages_for(
    ctx: RunContext, node: str, batch: SampleBatch, rewards: np.ndarray
) -> np.ndarray:
    """Group advantages with the node's agent estimator; a group is one invocation."""
    if len(batch) == 0:
        return np.zeros(0, np.float32)
    _, group_index = np.unique(batch.group_id, return_inverse=True)
    loss = ctx.spec.agents[ctx.spec.nodes[node].agent].loss
    adv = compute_advantages(
        loss.advantage, torch.from_numpy(rewards), torch.from_numpy(group_index.astype(np.int64))
    )
    return adv.numpy().astype(np.float32)


def score_micro_batch(
    ctx: RunContext, step: int, mb: int, episodes: tuple[Episode, ...], group: ScoreGroup
) -> ScoreRef:
    """Score `group.nodes` of micro-batch (step, mb); their rewards see `group.loads`."""
    spec = ctx.spec
    watch = Stopwatch("score", "-", step, mb)
    plugins_of(ctx)  # rewards of the user's own modules
    st = store_of(ctx)
    batches = {
        n: st.table(spec.nodes[n].agent).read(step=step, node=n, micro_batch=mb)
        for n in group.loads
    }
    rewards = reward_rows(ctx, batches, episodes, group.nodes)
    per_agent: dict[str, RewardSum] = defaultdict(RewardSum)
    for node in group.nodes:
        b = batches[node]
        adv = advantages_for(ctx, node, b, rewards[node])
        st.table(spec.nodes[node].agent).write_scores(
            SegmentKey(step, mb, node), b.sample_id, rewards[node], adv
        )
        per_agent[spec.nodes[node].agent] += RewardSum(float(rewards[node].sum()), len(b))
    team_nodes = set(spec.team_nodes or sinks(spec)) & set(group.nodes)
    team = sum(
        (RewardSum(float(rewards[n].sum()), len(rewards[n])) for n in team_nodes), RewardSum()
    )
    return ScoreRef(
        step,
        mb,
        group.nodes,
        sum(len(batches[n]) for n in group.nodes),
        dict(per_agent),
        team,
        watch.done(),
    )


@task(
    name="score",
    retries=1,
    task_run_name="score k={step} mb={mb} {group.nodes}",
    persist_result=False,
)
def score(
    ctx: RunContext,
    step: int,
    mb: int,
    episodes: tuple[Episode, ...],
    group: ScoreGroup,
    after: tuple[Any, ...] = (),
) -> ScoreRef:
    return score_micro_batch(ctx, step, mb, episodes, group)
