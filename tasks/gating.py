"""Which invocations of a node run: conditions (`when:`) and skipped inputs.

An invocation is *skipped* when a sample shown to it was skipped (a loop round not taken
skips everything below it) or when one of its node's conditions does not hold on the
samples of the input it reads. A skipped invocation still gets its `n` rows, marked
`skipped` (`storage.schema.SKIPPED`): every sample id the MEG's structure promises exists,
so lineage, resume and the audit stay structural, and nothing is trained or scored on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from meg.conditions import holds
from meg.expand import InvocationPlan
from meg.loops import gated
from meg.spec import MEGSpec, NodeSpec
from storage.schema import SKIPPED, TOOL_STOP, SampleBatch

Decode = Callable[[str, Sequence[int]], str]  # (input node, token ids) -> text


@dataclass(frozen=True, slots=True)
class Shown:
    """What a condition reads of one shown sample."""

    text: str
    terminal: bool  # a tool said the environment is done
    skipped: bool


def is_skipped(node: NodeSpec, plan: InvocationPlan, shown: Callable[[str], Shown]) -> bool:
    """Whether `plan` does not run (module docstring); `shown(sample id)` reads a sample.
    Training (`skipped`) and `flows.evaluate` both decide here."""
    if any(shown(s.id).skipped for _, samples in plan.inputs for s in samples):
        return True
    inputs = dict(plan.inputs)
    for cond in node.when:
        seen = [shown(s.id) for s in inputs[cond.node]]
        results = [holds(cond.fn, cond.params, v.text, v.terminal) for v in seen]
        if any(results) if cond.negate else not all(results):
            return True
    return False


def can_skip(spec: MEGSpec) -> bool:
    """Whether any invocation of `spec` may be skipped: a node has a condition (`gated`),
    or a tool call may fail (its invocation, and what follows, is then skipped). Neither:
    nothing is checked, plan by plan, on every generate task."""
    return gated(spec) or any(n.is_tool for n in spec.nodes.values())


def skipped(
    node: NodeSpec,
    plans: Sequence[InvocationPlan],
    batches: Mapping[str, SampleBatch],
    index: Mapping[str, int],
    decode: Decode,
) -> list[bool]:
    """Per plan, whether it is skipped. `batches[parent]` holds the committed rows of each
    input, `index` a sample id's row in its batch."""
    owner = {s.id: p for plan in plans for p, samples in plan.inputs for s in samples}

    @cache  # each shown sample decoded once
    def shown(sid: str) -> Shown:
        b, i = batches[owner[sid]], index[sid]
        reason = b.finish_reason[i]
        if reason == SKIPPED:
            return Shown("", False, True)
        return Shown(decode(owner[sid], b.response(i).tolist()), reason == TOOL_STOP, False)

    return [is_skipped(node, plan, shown) for plan in plans]


def plan_row(
    plan: InvocationPlan,
    sid: str,
    step: int,
    version: int,
    finish: str,
    span: tuple[float, float],
    prompt: Sequence[int] = (),
    response: Sequence[int] = (),
    logprobs: Sequence[float] = (),
) -> dict[str, Any]:
    """One store row of sample `sid` of `plan` (what `SampleBatch.from_rows` takes): the
    one place a generate task's row is spelled out, for sampled, tool and skipped rows."""
    return {
        "sample_id": sid,
        "group_id": plan.group_id,
        "parent_ids": plan.parent_ids(),
        "node": plan.node,
        "episode": plan.episode,
        "step": step,
        "policy_version": version,
        "prompt_ids": list(prompt),
        "response_ids": list(response),
        "logprobs": list(logprobs),
        "finish_reason": finish,
        "gen_start": span[0],
        "gen_end": span[1],
    }


def skipped_rows(
    plan: InvocationPlan, n: int, step: int, version: int, now: float
) -> list[dict[str, Any]]:
    """The `n` rows of a skipped invocation: no prompt, no response, never trained."""
    return [plan_row(plan, sid, step, version, SKIPPED, (now, now)) for sid in plan.sample_ids(n)]
