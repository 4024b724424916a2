"""Tools behind a registry: `@register_tool("name")`, the bodies of a MEG's tool nodes.

A tool is an environment step: `fn(sample, episode, task, **params) -> ToolResult | str`.
`sample` is the input sample the invocation answers (its driver, else its first shown input),
`episode` the samples of the invocation's inputs (text, node, parents) and `task` the
dataset item. It returns the text the next turn reads, and optionally `terminal` (the
environment is done: every test passed), a `reward` (kept in the tool row's score) and
`metadata` (kept in its score status). A plain string is a non-terminal result.

A tool may carry a *reference observation* for the warm start: `@register_tool("name",
reference=fn)` with `fn(text, task, **params) -> str`, the text the tool gives for a sample
whose text is `text`, computed without side effects or the sandbox (the warm start feeds it
only reference completions). `workloads.warm_start.reference_pairs` asks for it on every tool
node of a MEG (a tool node is never trained: its reference text is only what the following
turns read); a tool without one cannot be warm-started.

Tools run where rewards run (`tasks.reward_calls`: a pool of reward processes, a timeout per
call, a failing call fails its invocation's rows, not the run), so a tool that executes model
output must itself use the sandbox, as `run_tests` does. Built in: `calculator` and `lookup`
(deterministic, for tests and examples) here, `run_tests` in `workloads.code_repair`.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meg.registry import Registry
from workloads.datasets import TaskItem
from workloads.rewards import EpisodeView, SampleView

MAX_TOOL_TEXT = 4000  # characters of a tool's text that reach the next prompt


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns: the observation text, and whether the environment is done."""

    text: str
    terminal: bool = False
    reward: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The wire form (`tasks.reward_child` → the worker): strict JSON, text bounded."""
        reward = None if self.reward is None or not math.isfinite(self.reward) else self.reward
        return {
            "text": str(self.text)[:MAX_TOOL_TEXT],
            "terminal": bool(self.terminal),
            "reward": reward,
            "metadata": json.loads(json.dumps(dict(self.metadata), default=str)),
        }

    @staticmethod
    def of(value: Any) -> ToolResult:
        """A tool's return value as a result; anything but a string or a result is an error
        (the call fails, with the type in the reason)."""
        if isinstance(value, ToolResult):
            return value
        if isinstance(value, str):
            return ToolResult(value)
        raise TypeError(f"a tool returns a ToolResult or a str, not {type(value).__name__}")


ToolFn = Callable[..., ToolResult | str]
ToolReference = Callable[..., str]  # (text, task, **params) -> the tool's text for it


def _check_tool(name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"tool {name!r} is {type(fn).__name__}, not a function")


TOOLS: Registry[ToolFn] = Registry(
    "tool", importable=True, check=_check_tool, builtins=("workloads.code_repair",)
)


def register_tool(
    name: str, *, reference: ToolReference | None = None
) -> Callable[[ToolFn], ToolFn]:
    """Decorator: `@register_tool("search")` on `fn(sample, episode, task, **params)`;
    `reference`: its warm-start observation (module doc), in `TOOLS.meta(name)`."""
    return TOOLS.register(name, reference=reference)


def tool_reference(name: str) -> ToolReference:
    """Tool `name`'s warm-start reference observation; `KeyError` naming the tool when it
    has none (and the registry's error for an unknown tool)."""
    reference = TOOLS.meta(name).get("reference")
    if reference is None:
        raise KeyError(
            f"warm start: tool {name!r} has no reference observation; register it with "
            f"`@register_tool({name!r}, reference=fn)` (workloads/tools.py)"
        )
    fn: ToolReference = reference
    return fn


def get_tool(name: str) -> ToolFn:
    return TOOLS.get(name)


def known_tools() -> Registry[ToolFn]:
    return TOOLS


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
}


def _evaluate(node: ast.AST) -> int:
    """Integer arithmetic over an expression tree: numbers and + - * // % only (never
    `eval`: the text is model output)."""
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**9:
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if abs(left) > 10**9 or abs(right) > 10**9:
            raise ValueError("numbers too large")
        return int(_OPS[type(node.op)](left, right))
    raise ValueError(f"not integer arithmetic: {ast.dump(node)[:60]}")


@register_tool("calculator")
def calculator(sample: SampleView, episode: EpisodeView, task: TaskItem, **_: Any) -> ToolResult:
    """The value of the integer expression in the sample's text (`3+4*2` → ` = 11`); an
    expression it cannot read answers ` = ?`. Terminal when the value is the task's answer."""
    try:
        value = _evaluate(ast.parse(sample.text.strip().rstrip("="), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return ToolResult(" = ?", metadata={"parsed": False})
    return ToolResult(f" = {value}", terminal=str(value) == task.answer.strip())


@register_tool("lookup")
def lookup(
    sample: SampleView, episode: EpisodeView, task: TaskItem, *, table: Mapping[str, str]
) -> ToolResult:
    """`table[key]` for the sample's stripped text as the key (a deterministic search
    engine); a missing key answers ` not found`."""
    key = sample.text.strip()
    if key in table:
        return ToolResult(f" {table[key]}", terminal=True)
    return ToolResult(" not found")
