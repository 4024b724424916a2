"""The agentic parts of a MEG: tool (environment) nodes, conditions, bounded loops.

- `ToolSpec`: a node whose body is user Python (a registered *tool*, a plug-in like a
  reward) instead of an LLM call. It reads its inputs' samples and returns text (and
  optionally a terminal flag, a reward and metadata). Its rows live in the table of the agent
  that acted (the agent of its driver input) and are never trained: environment text enters
  the next turn's *prompt*, and prompts are masked from the loss.
- `WhenSpec`: a condition over one input's samples; a node runs (per invocation) only when
  all of its conditions hold. An invocation that does not run, or whose input was itself
  skipped, is stored as `skipped` rows: not trained, not scored, not a zero reward.
- `LoopSpec`: "repeat (act → check) until accepted, at most `rounds` rounds", unrolled into
  nodes `{body}@{round}` (`meg.loops`). Round r > 1 re-enters at the `again` node, gated by
  the negation of `until` on round r-1.

These are pydantic models like the rest of `meg.spec` (frozen, unknown keys forbidden), so
a misspelt field is an error naming it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from meg.frozen import Frozen
from meg.limits import MAX_ROUNDS, MAX_TIMEOUT_S


class CallSpec(Frozen):
    """A registered function a node binds, run in the worker's reward processes: `fn`, its
    keyword `params` and a timeout per call (a reward's `RewardSpec`, a tool's `ToolSpec`)."""

    fn: str = Field(description="A registered name, or `module:function` of your own.")
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(
        None,
        gt=0.0,
        le=MAX_TIMEOUT_S,
        description="Per-call timeout, seconds; default `run.scoring.timeout_s`.",
    )


class ToolSpec(CallSpec):
    """The tool a node runs: a registered name (`run_tests`, `calculator`, `lookup`, or one
    of a plug-in's `@register_tool`), or `module:function`; `params` are passed as keywords.
    It runs in the worker's reward processes, with a timeout per call like a reward."""

    fn: str = Field(description="A registered tool name, or `module:function` of your own.")

    @field_validator("fn")
    @classmethod
    def _named(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a tool node must name its tool plug-in (`fn`)")
        return v


class WhenSpec(Frozen):
    """A condition on the samples of one input node shown to an invocation: the registered
    condition `fn` (`contains`, `terminal`, `matches`, or a plug-in's) holds for each of them
    (`negate`: holds for none)."""

    node: str = Field(description="An input of this node whose samples the condition reads.")
    fn: str = Field("contains", description="A registered condition name.")
    params: dict[str, Any] = Field(default_factory=dict)
    negate: bool = False


class TurnOf(Frozen):
    """Set by loop unrolling, not by hand: which loop and body node a node is a round of.

    The rounds of one body node are one agent's turns; the agent's `loss.credit` turns their
    rewards into per-turn advantages across the loop (`engines.training.turn_credit`)."""

    loop: str
    body: str
    round: int = Field(ge=1)
    entry: str = Field(description="The body node a round starts at (the loop's `again`).")


class LoopSpec(Frozen):
    """A bounded loop, unrolled into nodes `{body}@{round}` for round 1..`rounds`.

    `body` holds one round's nodes (names without `@`; an input or placeholder naming a body
    node means this round's). `again` re-enters the next round: one body node whose fields
    it overrides, where a body name means the *previous* round's (`{code}` is the code to
    repair). `until` are the stop conditions, read on the previous round: round r > 1 runs
    only where none holds. The untaken rounds are stored as `skipped`.
    """

    rounds: int = Field(
        ge=1,
        le=MAX_ROUNDS,
        description="The bound: at most this many rounds (required: a loop needs one).",
    )
    body: dict[str, dict[str, Any]] = Field(
        min_length=1, description="One round's nodes, as under `nodes:`."
    )
    again: dict[str, dict[str, Any]] = Field(
        description="The node a later round starts at, with the fields that differ "
        "(a body name here means the previous round's node)."
    )
    until: list[WhenSpec] = Field(
        min_length=1,
        description="Stop conditions on the previous round's body nodes (any holds: stop).",
    )
