"""Evaluation of agentic MEGs: tool nodes, skipped invocations, a loop's final outcome.

`flows.evaluate` runs every node in topological order in one process. Here is what it
needs beyond LLM nodes, with the training rollout's semantics (`tasks.gating`,
`tasks.tool_calls`): an invocation is skipped when a shown input was skipped or a `when:`
condition fails; a tool node calls its tool in reward processes (its text encoded with the
table agent's tokenizer, as stored in training); a skipped sample has no reward. And a
loop's *final* outcome: per rollout of the loop (each sample of its entry's first round),
the reward of the last round it took, the number a repair loop is judged by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from meg import MEGSpec
from meg.expand import InvocationPlan, SampleInfo
from meg.loops import chain_nodes, round_name
from tasks.tool_calls import call_tool_node
from workloads.datasets import TaskItem


@dataclasses.dataclass(frozen=True, slots=True)
class Sampled:
    """One sample: its plan (lineage, parents), tokens and text."""

    plan: InvocationPlan
    info: SampleInfo
    response_ids: tuple[int, ...]
    text: str
    skipped: bool = False  # a condition did not run it, or an input was skipped
    terminal: bool = False  # a tool said the environment is done


def loop_finals(
    spec: MEGSpec,
    sample_ids: dict[str, list[str]],
    lineage: Callable[[str], dict[str, str]],
    rewards: dict[str, np.ndarray],
    skipped: Callable[[str], bool],
) -> dict[str, dict[str, float]]:
    """Per loop body node of an agent (`repair.code`): over the rollouts of the loop (the
    samples of its entry's round 1), `_outcomes` of their first and last rounds taken."""
    out: dict[str, dict[str, float]] = {}
    for (loop, body), rounds in chain_nodes(spec).items():
        turn = spec.nodes[rounds[0]].turn
        assert turn is not None
        entry = round_name(turn.entry, 1)
        reward_of = {
            sid: float(rewards[n][i]) for n in rounds for i, sid in enumerate(sample_ids[n])
        }
        first: dict[str, float] = {}  # rollout → reward of its first round
        last: dict[str, tuple[int, float]] = {}  # rollout → (round, reward) of its last round
        for r, n in enumerate(rounds, 1):
            for sid in sample_ids[n]:
                if skipped(sid):
                    continue
                root = lineage(sid).get(entry, sid)
                first.setdefault(root, reward_of[sid])
                if r >= last.get(root, (0, 0.0))[0]:
                    last[root] = (r, reward_of[sid])
        out[f"{loop}.{body}"] = _outcomes(
            np.array([first[k] for k in last], np.float64),
            np.array([v for _, v in last.values()], np.float64),
        )
    return out


def _outcomes(first: np.ndarray, final: np.ndarray) -> dict[str, float]:
    """A loop's outcome over its rollouts (first and last round's reward of each): the mean
    final reward, the fraction `solved` (final 1), and of the rollouts whose first round
    fell short, how many there were (`first_failed`) and the fraction the later rounds
    repaired (`repaired`: what the repair turns themselves achieve)."""
    ok = np.isfinite(final)
    first, final = first[ok], final[ok]
    short = np.isfinite(first) & (first < 1.0)
    return {
        "rollouts": float(len(final)),
        "final_reward": round(float(final.mean()), 4) if len(final) else 0.0,
        "solved": round(float((final >= 1.0).mean()), 4) if len(final) else 0.0,
        "first_failed": float(short.sum()),
        "repaired": round(float((final[short] >= 1.0).mean()), 4) if short.any() else 0.0,
    }


def tool_samples(
    spec: MEGSpec,
    node: str,
    plans: list[InvocationPlan],
    tasks: dict[str, TaskItem],
    done: dict[str, Sampled],
    tok: Any,
) -> list[Sampled]:
    """A tool node's samples: its text encoded with the table agent's tokenizer (as stored
    in training); a failed call is a skipped invocation, as in training."""
    views: dict[str, dict[str, dict[str, Any]]] = {eid: {} for eid in tasks}
    for plan in plans:
        for parent, info in plan.input_samples():
            shown = done[info.id]
            views[plan.episode][info.id] = {
                "node": parent,
                "text": shown.text,
                "parents": list(shown.plan.parent_ids()),
            }
    out = []
    for plan, o in zip(plans, call_tool_node(spec, node, plans, tasks, views), strict=True):
        (info,) = plan.child_samples(1)
        if o.failed or o.tool is None:
            out.append(Sampled(plan, info, (), "", skipped=True))
            continue
        ids = tuple(tok.encode(o.tool["text"], add_special_tokens=False))
        out.append(Sampled(plan, info, ids, o.tool["text"], terminal=bool(o.tool["terminal"])))
    return out
