"""A tool node's generate task: run its tool on each invocation, store the observations.

The tool runs in the worker's reward processes (`tasks.reward_calls`: the same pool, the
same timeout per call, a failing call costs its invocation, not the run). Its text is stored
as the row's response, encoded with the table agent's tokenizer, so the next turn splices
it into its prompt like any parent's response; its rows are never trained
(`storage.schema.NOT_TRAINED`). The tool's reward and metadata go to the row's score
segment, committed before the rows, so a committed tool segment always has its scores.

A failed call (the tool raised or ran over its timeout) stores the invocation as `skipped`,
with the reason in its score status: the turns after it do not run on an observation that
was never made.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meg import MEGSpec
from meg.expand import InvocationPlan
from storage.schema import SKIPPED, TOOL, TOOL_STOP, SampleBatch, SegmentKey
from storage.table import Table
from tasks.context import RunContext
from tasks.gating import plan_row, skipped_rows
from tasks.refs import Episode
from tasks.reward_calls import Call, Job, Outcome, pool_for
from tasks.scoring import sample_view
from tasks.worker import tokenizer_of
from workloads.datasets import TaskItem

log = logging.getLogger(__name__)


def _views(
    ctx: RunContext,
    plans: Sequence[InvocationPlan],
    batches: dict[str, SampleBatch],
    index: dict[str, int],
) -> dict[str, dict[str, Any]]:
    """What a tool sees of its invocations' inputs: text, node and parents of each sample."""
    out: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for parent, s in plan.input_samples():
            tok = tokenizer_of(ctx, ctx.spec.nodes[parent].agent)  # cached per agent
            out[s.id] = sample_view(tok, parent, batches[parent], index[s.id])
    return out


def call_tools(
    ctx: RunContext,
    node: str,
    plans: Sequence[InvocationPlan],
    batches: dict[str, SampleBatch],
    index: dict[str, int],
    episodes: tuple[Episode, ...],
) -> list[Outcome]:
    """`call_tool_node` with what the tool sees read from the inputs' committed rows."""
    by_episode: dict[str, list[InvocationPlan]] = {}
    for plan in plans:
        by_episode.setdefault(plan.episode, []).append(plan)
    views = {ep: _views(ctx, mine, batches, index) for ep, mine in by_episode.items()}
    return call_tool_node(ctx.spec, node, plans, dict(episodes), views)


def call_tool_node(
    spec: MEGSpec,
    node: str,
    plans: Sequence[InvocationPlan],
    tasks: Mapping[str, TaskItem],
    views: Mapping[str, dict[str, dict[str, Any]]],
) -> list[Outcome]:
    """One tool call per plan, on the sample it answers (its driver: the first shown
    input); the calls of one episode are one job, seeing `views[episode]`. Training's
    generate task and `flows.evaluate` both call this."""
    tool = spec.nodes[node].tool
    assert tool is not None
    timeout = tool.timeout_s or spec.run.scoring.timeout_s
    by_episode: dict[str, list[int]] = {}
    for k, plan in enumerate(plans):
        by_episode.setdefault(plan.episode, []).append(k)
    jobs = [
        Job(
            dataclasses.asdict(tasks[ep]),
            views[ep],
            tuple(
                Call(plans[k].inputs[0][1][0].id, tool.fn, tool.params, timeout, kind="tool")
                for k in ks
            ),
        )
        for ep, ks in by_episode.items()
    ]
    bound = sorted({b.fn for b in spec.rewards.values()})
    pool = pool_for(spec.plugins, spec.run.scoring.processes, bound)
    out: list[Outcome] = [Outcome(float("nan"))] * len(plans)
    for ks, outcomes in zip(by_episode.values(), pool.run(jobs), strict=True):
        for k, o in zip(ks, outcomes, strict=True):
            out[k] = o
            if o.failed:
                log.warning("tool %s of %s failed: %s", tool.fn, plans[k].group_id, o.error)
    return out


def _status(o: Outcome) -> str:
    if o.failed:
        return f"failed: {o.error}"
    meta = (o.tool or {}).get("metadata") or {}
    return f"tool {json.dumps(meta, sort_keys=True)}" if meta else "tool"


def tool_rows(
    ctx: RunContext,
    node: str,
    step: int,
    plans: Sequence[InvocationPlan],
    skip: Sequence[bool],
    batches: dict[str, SampleBatch],
    index: dict[str, int],
    episodes: tuple[Episode, ...],
    version: int,
) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """The node's rows (one per invocation) with their score columns: the tool's reward
    (NaN: none) and status (`tool ...`, `failed: ...` or `skipped`)."""
    live = [k for k, s in enumerate(skip) if not s]
    start = time.time()
    outcomes = dict(
        zip(
            live,
            call_tools(ctx, node, [plans[k] for k in live], batches, index, episodes),
            strict=True,
        )
    )
    tok = tokenizer_of(ctx, ctx.spec.nodes[node].agent)
    now = time.time()
    rows: list[dict[str, Any]] = []
    rewards: list[float] = []
    status: list[str] = []
    for k, plan in enumerate(plans):
        o = outcomes.get(k)
        if o is None or o.failed or o.tool is None:
            rows += skipped_rows(plan, 1, step, version, now)
            rewards.append(float("nan"))
            status.append(SKIPPED if o is None else _status(o))
            continue
        ids = list(tok.encode(o.tool["text"], add_special_tokens=False))
        finish = TOOL_STOP if o.tool["terminal"] else TOOL
        sid = plan.sample_ids(1)[0]
        rows.append(
            plan_row(plan, sid, step, version, finish, (start, now), (), ids, [0.0] * len(ids))
        )
        r = o.tool.get("reward")
        rewards.append(float("nan") if r is None else float(r))
        status.append(_status(o))
    return rows, np.asarray(rewards, np.float32), np.asarray(status, np.str_)


def commit_tool_segment(
    table: Table,
    key: SegmentKey,
    rows: list[dict[str, Any]],
    rewards: np.ndarray,
    status: np.ndarray,
) -> tuple[Any, SampleBatch]:
    """Scores first, then rows (module docstring); the rows' ref and batch."""
    batch = SampleBatch.from_rows(rows)
    table.write_scores(key, batch.sample_id, rewards, np.zeros(len(batch), np.float32), status)
    return table.write_segment(key, batch), batch
