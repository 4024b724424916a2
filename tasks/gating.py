"""Which invocations of a node run: conditions (`when:`) and skipped inputs.

An invocation is *skipped* when a sample shown to it was skipped (a loop round not taken
skips everything below it) or when one of its node's conditions does not hold on the
samples of the input it reads. A skipped invocation still gets its `n` rows, marked
`skipped` (`storage.schema.SKIPPED`): every sample id the MEG's structure promises exists,
so lineage, resume and the audit stay structural, and nothing is trained or scored on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from meg.conditions import holds
from meg.expand import InvocationPlan
from meg.spec import NodeSpec
from storage.schema import SKIPPED, TOOL_STOP, SampleBatch

Decode = Callable[[str, Sequence[int]], str]  # (input node, token ids) -> text


def skipped(
    node: NodeSpec,
    plans: Sequence[InvocationPlan],
    batches: Mapping[str, SampleBatch],
    index: Mapping[str, int],
    decode: Decode,
) -> list[bool]:
    """Per plan, whether it is skipped (module docstring). `batches[parent]` holds the
    committed rows of each input, `index` a sample id's row in its batch."""
    out = []
    for plan in plans:
        shown = {p: [index[s.id] for s in samples] for p, samples in plan.inputs}
        gone = any(
            batches[p].finish_reason[i] == SKIPPED for p, rows in shown.items() for i in rows
        )
        out.append(
            gone or not all(_holds(c, batches[c.node], shown[c.node], decode) for c in node.when)
        )
    return out


def _holds(cond: Any, batch: SampleBatch, rows: Sequence[int], decode: Decode) -> bool:
    """`cond` on every shown row of its input (`negate`: on none of them)."""
    results = [
        holds(
            cond.fn,
            cond.params,
            decode(cond.node, batch.response(i).tolist()),
            batch.finish_reason[i] == TOOL_STOP,
        )
        for i in rows
    ]
    return not any(results) if cond.negate else all(results)


def skipped_rows(
    plan: InvocationPlan, n: int, node: str, step: int, version: int, now: float
) -> list[dict[str, Any]]:
    """The `n` rows of a skipped invocation: no prompt, no response, never trained."""
    return [
        {
            "sample_id": sid,
            "group_id": plan.group_id,
            "parent_ids": plan.parent_ids(),
            "node": node,
            "episode": plan.episode,
            "step": step,
            "policy_version": version,
            "prompt_ids": [],
            "response_ids": [],
            "logprobs": [],
            "finish_reason": SKIPPED,
            "gen_start": now,
            "gen_end": now,
        }
        for sid in plan.sample_ids(n)
    ]
