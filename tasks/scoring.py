"""The score task: rewards and group advantages for one score group of one (step, micro-batch).

A score group (`meg.score_groups`) is the set of nodes that can be scored at the same moment:
as soon as they and what their rewards read are generated. The task reads the committed rows
of the nodes the group's rewards see, rebuilds each episode as text, applies the registered
reward bound to each node of the group, turns rewards into advantages with the agent's
registered estimator (groups = one node invocation, or one prompt's episodes under `sera`),
and commits one score segment per node.
Rewards for a node with no binding are 0 (its agent then gets no signal).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from prefect import task

from engines.training.advantages import compute_advantages
from meg import MEGSpec, ScoreGroup, sinks
from policies import selection_policy
from storage.schema import SKIPPED, SampleBatch, SegmentKey
from tasks.context import RunContext, Stopwatch
from tasks.failures import NodeScores, ScoredRows, apply_failure_rule
from tasks.loop_credit import loop_advantages
from tasks.refs import Episode, RewardSum, ScoreRef
from tasks.reward_calls import Call, Job, Outcome, pool_for
from tasks.worker import plugins_of, store_of, tokenizer_of
from workloads.datasets import TaskItem

log = logging.getLogger(__name__)


Views = dict[str, dict[str, dict[str, Any]]]  # episode → sample id → {node, text, parents}


def call_rewards(
    spec: MEGSpec, views: Views, tasks: dict[str, TaskItem], targets: list[tuple[str, str, str]]
) -> list[Outcome]:
    """The outcome of the reward bound to each target `(node, episode, sample id)` (every
    target's node must have one), run in this process's reward processes
    (`tasks.reward_calls`: a timeout per call; a failing call fails only its sample)."""
    calls: dict[str, list[Call]] = defaultdict(list)
    index: dict[str, list[int]] = defaultdict(list)  # episode → positions in `targets`
    for k, (node, ep, sid) in enumerate(targets):
        binding = spec.rewards[node]
        timeout = binding.timeout_s or spec.run.scoring.timeout_s
        calls[ep].append(Call(sid, binding.fn, binding.params, timeout))
        index[ep].append(k)
    jobs = [Job(dataclasses.asdict(tasks[ep]), views[ep], tuple(cs)) for ep, cs in calls.items()]
    out: list[Outcome] = [Outcome(float("nan"))] * len(targets)
    bound = {b.fn for b in spec.rewards.values()}
    pool = pool_for(spec.plugins, spec.run.scoring.processes, sorted(bound))
    for ep, outcomes in zip(calls, pool.run(jobs), strict=True):
        for k, o in zip(index[ep], outcomes, strict=True):
            out[k] = o
            if o.failed:
                log.warning("reward of %s failed: %s", targets[k][2], o.error)
    return out


def sample_view(tok: Any, node: str, batch: SampleBatch, i: int) -> dict[str, Any]:
    """What a reward or a tool sees of row `i`: its node, its text (decoded without special
    tokens) and its parents' sample ids."""
    return {
        "node": node,
        "text": tok.decode(batch.response(i).tolist(), skip_special_tokens=True),
        "parents": [p for p in str(batch.parent_ids[i]).split(",") if p],
    }


def episode_views(ctx: RunContext, batches: dict[str, SampleBatch]) -> Views:
    """Per episode, the view of every row in `batches` that exists (not skipped)."""
    views: Views = defaultdict(dict)
    for node, b in batches.items():
        tok = tokenizer_of(ctx, ctx.spec.nodes[node].agent)
        for i in range(len(b)):
            if b.finish_reason[i] == SKIPPED:  # never happened: no sample to see
                continue
            views[str(b.episode[i])][str(b.sample_id[i])] = sample_view(tok, node, b, i)
    return views


def reward_rows(
    ctx: RunContext,
    batches: dict[str, SampleBatch],
    views: Views,
    episodes: tuple[Episode, ...],
    nodes: tuple[str, ...],
) -> dict[str, NodeScores]:
    """Rewards and call outcomes per row of each of `nodes` (`call_rewards`), the rewards
    seeing `views` (`episode_views` of `batches`)."""
    spec = ctx.spec
    rows = [
        (n, i)
        for n in nodes
        if n in spec.rewards
        for i in range(len(batches[n]))
        if batches[n].finish_reason[i] != SKIPPED
    ]
    targets = [(n, str(batches[n].episode[i]), str(batches[n].sample_id[i])) for n, i in rows]
    out = {n: NodeScores.unscored(len(batches[n])) for n in nodes}
    for (n, i), o in zip(rows, call_rewards(spec, views, dict(episodes), targets), strict=True):
        out[n].reward[i], out[n].error[i] = o.reward, o.error
    return out


def group_keys(
    ctx: RunContext, node: str, batch: SampleBatch, episodes: tuple[Episode, ...]
) -> np.ndarray:
    """The advantage group of each row: its invocation (`group_id`); under a selection
    policy that gives a prompt several episodes (`sera`), a node without inputs (it sees the
    task alone) groups the rows of one prompt in one step, across its episodes."""
    if not selection_policy(ctx.spec).merges_groups or ctx.spec.nodes[node].inputs:
        return batch.group_id
    task = {eid: item.id for eid, item in episodes}
    return np.array(
        [
            f"{s}/{task.get(e, e)}/{node}"
            for e, s in zip(batch.episode.tolist(), batch.step.tolist(), strict=True)
        ]
    )


def multiplicity(keys: np.ndarray, episodes: np.ndarray, base: int = 1) -> np.ndarray:
    """Per row, base/k for a group spanning k episodes (SERA's multiplicity correction
    N0/N_q): a prompt given k episodes weighs as one at the mean, `base` episodes, so an
    even allocation trains exactly as uniform groups of `base · n` samples. Pure."""
    spans: dict[str, set[str]] = defaultdict(set)
    for g, e in zip(keys.tolist(), episodes.tolist(), strict=True):
        spans[g].add(e)
    return np.array([base / len(spans[g]) for g in keys.tolist()], np.float32)


def advantages_for(
    ctx: RunContext,
    node: str,
    batch: SampleBatch,
    scored: ScoredRows,
    episodes: tuple[Episode, ...] = (),
) -> np.ndarray:
    """Group advantages with the node's agent estimator over the rows `scored.used`, a
    group per `group_keys` (merged ones scaled by `multiplicity`). Rows left out (a dropped
    group) get 0."""
    adv = np.zeros(len(batch), np.float32)
    use = np.flatnonzero(scored.used)
    if len(use) == 0:
        return adv
    keys = group_keys(ctx, node, batch, episodes)[use]
    _, group_index = np.unique(keys, return_inverse=True)
    loss = ctx.spec.agents[ctx.spec.nodes[node].agent].loss
    adv[use] = compute_advantages(
        loss.advantage,
        torch.from_numpy(scored.reward[use]),
        torch.from_numpy(group_index.astype(np.int64)),
    ).numpy()
    select = selection_policy(ctx.spec)
    if select.merges_groups and not ctx.spec.nodes[node].inputs:  # SERA's correction
        adv[use] *= multiplicity(keys, batch.episode[use], select.mean_episodes)
    return adv


def without_skipped(scored: ScoredRows, batch: SampleBatch) -> ScoredRows:
    """Skipped rows (an invocation that did not run) take no part: reward NaN, status
    `skipped`, not in any group's statistics (so not a zero reward either)."""
    gone = batch.finish_reason == SKIPPED
    if not gone.any():
        return scored
    return ScoredRows(
        np.where(gone, np.float32(np.nan), scored.reward).astype(np.float32),
        np.where(gone, np.str_(SKIPPED), scored.status).astype(np.str_),
        scored.used & ~gone,
    )


def score_rows(
    ctx: RunContext,
    step: int,
    mb: int,
    episodes: tuple[Episode, ...],
    group: ScoreGroup,
    held: dict[str, SampleBatch] | None = None,
) -> tuple[ScoreRef, dict[str, SampleBatch]]:
    """Score `group.nodes` of micro-batch (step, mb); their rewards see `group.loads`, read
    from the store unless `held` has their committed rows already (a fused generate).

    Returns the score task's ref and each scored node's rows with the scores just committed
    joined on: what `Table.read` of the two segments returns, without reading them back (a
    fused generate hands them to the trainer, `tasks.refs.GenRef.scored`)."""
    spec = ctx.spec
    watch = Stopwatch("score", "-", step, mb)
    plugins_of(ctx)  # rewards of the user's own modules
    st = store_of(ctx)
    held = held or {}
    batches = {
        n: held[n]
        if n in held
        else st.table(spec.nodes[n].agent).read(step=step, node=n, micro_batch=mb)
        for n in group.loads
    }
    views = episode_views(ctx, batches)
    raw = reward_rows(ctx, batches, views, episodes, group.nodes)
    rule = spec.run.scoring.on_failure
    per_agent: dict[str, RewardSum] = defaultdict(RewardSum)
    failed: dict[str, int] = defaultdict(int)
    sums: dict[str, RewardSum] = {}
    rows: dict[str, tuple[SampleBatch, ScoredRows]] = {}
    for node in group.nodes:
        if spec.nodes[node].is_tool:  # scored by its own generate task (`tasks.tool_calls`)
            continue
        b = batches[node]
        rows[node] = (b, without_skipped(apply_failure_rule(rule, raw[node], b.group_id), b))
    looped = loop_advantages(ctx, rows, views)
    joined: dict[str, SampleBatch] = {}
    for node, (b, scored) in rows.items():
        adv = looped[node] if node in looped else advantages_for(ctx, node, b, scored, episodes)
        st.table(spec.nodes[node].agent).write_scores(
            SegmentKey(step, mb, node), b.sample_id, scored.reward, adv, scored.status
        )
        joined[node] = b.with_scores(scored.reward, adv, scored.status)
        agent = spec.nodes[node].agent
        sums[node] = RewardSum.of(scored.reward)
        per_agent[agent] += sums[node]
        failed[agent] += raw[node].failed
    team_nodes = set(spec.team_nodes or sinks(spec)) & set(rows)
    team = sum((sums[n] for n in team_nodes), RewardSum())
    ref = ScoreRef(
        step,
        mb,
        group.nodes,
        sum(int((b.finish_reason != SKIPPED).sum()) for b, _ in rows.values()),
        dict(per_agent),
        team,
        watch.done(),
        {a: n for a, n in failed.items() if n},
        next(
            (
                f"{batches[n].sample_id[i]}: {e}"
                for n in group.nodes
                for i, e in enumerate(raw[n].error)
                if e is not None
            ),
            "",
        ),
    )
    return ref, joined


HAND_MAX_BYTES = 1 << 20  # rows handed to the trainer inside a GenRef, at most


def rows_to_hand(ctx: RunContext, node: str, joined: dict[str, SampleBatch]) -> SampleBatch | None:
    """The scored rows a fused generate hands its trainer (`GenRef.scored`): when `node` is
    its agent's only node, and only up to `HAND_MAX_BYTES`. The driver also fetches every
    GenRef, over whatever link joins it to the cluster; a read from the store saves ~10 ms
    a micro-batch, which matters for a tiny batch's step and not for a large one's."""
    agent = ctx.spec.nodes[node].agent
    if node not in joined or ctx.nodes_of(agent) != [node]:
        return None
    rows = joined[node].trainable()
    return rows if rows.nbytes <= HAND_MAX_BYTES else None


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
    return score_rows(ctx, step, mb, episodes, group)[0]
