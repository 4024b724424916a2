"""The score task: rewards and group advantages for one (step, micro-batch).

Reads every node's committed rows of the micro-batch, rebuilds each episode as text, applies
the registered reward function bound to each node, turns rewards into advantages with the
agent's registered estimator (groups = one node invocation), and commits one score segment
per node. Rewards for a node with no binding are 0 (its agent then gets no signal).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from prefect import task

from engines.training.advantages import compute_advantages
from meg import sinks
from storage.schema import SampleBatch, SegmentKey
from tasks.context import RunContext, Stopwatch, Timing
from tasks.rollout import Episode
from tasks.worker import store_of, tokenizer_of
from workloads.rewards import EpisodeView, SampleView, get_reward


@dataclass(frozen=True, slots=True)
class ScoreRef:
    step: int
    micro_batch: int
    rows: int
    node_reward: dict[str, float]
    agent_reward: dict[str, float]
    team_reward: float
    timing: Timing


def reward_rows(
    ctx: RunContext, batches: dict[str, SampleBatch], episodes: tuple[Episode, ...]
) -> dict[str, np.ndarray]:
    """Reward per row of each node's batch, from the bound reward functions."""
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
    for node, b in batches.items():
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
    ctx: RunContext, step: int, mb: int, episodes: tuple[Episode, ...]
) -> ScoreRef:
    spec = ctx.spec
    watch = Stopwatch("score", "-", step, mb)
    st = store_of(ctx)
    batches = {
        n: st.table(spec.nodes[n].agent).read(step=step, node=n, micro_batch=mb) for n in spec.nodes
    }
    rewards = reward_rows(ctx, batches, episodes)
    per_agent: dict[str, list[float]] = defaultdict(list)
    for node, b in batches.items():
        adv = advantages_for(ctx, node, b, rewards[node])
        st.table(spec.nodes[node].agent).write_scores(
            SegmentKey(step, mb, node), b.sample_id, rewards[node], adv
        )
        per_agent[spec.nodes[node].agent].extend(rewards[node].tolist())
    team_nodes = spec.team_nodes or sinks(spec)
    team = [float(rewards[n].mean()) for n in team_nodes if len(rewards[n])]
    return ScoreRef(
        step,
        mb,
        sum(len(b) for b in batches.values()),
        {n: float(r.mean()) if len(r) else 0.0 for n, r in rewards.items()},
        {a: float(np.mean(v)) for a, v in per_agent.items()},
        float(np.mean(team)) if team else 0.0,
        watch.done(),
    )


@task(name="score", retries=1, task_run_name="score k={step} mb={mb}", persist_result=False)
def score(
    ctx: RunContext, step: int, mb: int, episodes: tuple[Episode, ...], after: tuple[Any, ...] = ()
) -> ScoreRef:
    return score_micro_batch(ctx, step, mb, episodes)
