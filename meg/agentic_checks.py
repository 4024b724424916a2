"""Cross-field rules of tool nodes, conditions and loops (called by `meg.load.validate`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meg.conditions import CONDITIONS, params_problem
from meg.errors import MEGError
from meg.registry import Registry, UnknownNameError
from meg.spec import MEGSpec

Fail = Callable[[str, str], MEGError]


def check_agentic(spec: MEGSpec, fail: Fail, known_tools: Registry[Any] | None) -> None:
    """Tool nodes name a known tool, are not rewarded and reach an agent's table; every
    condition reads an input of its node, with a known name and params it takes; the
    rollout policies that cannot skip or cut such episodes are refused."""
    for name, node in spec.nodes.items():
        where = f"nodes.{name}"
        if node.is_tool:
            assert node.tool is not None
            if not node.agent:
                raise fail(
                    "a tool node's rows go to the table of its driver input's agent, and its "
                    "inputs reach no agent: give it `agent:`",
                    f"{where}.agent",
                )
            if name in spec.rewards:
                raise fail(
                    "a tool node is not trained and takes no reward binding; its tool may "
                    "return a reward of its own, and the agents' nodes are rewarded",
                    f"rewards.{name}",
                )
            if known_tools is not None:
                try:
                    known_tools.get(node.tool.fn)
                except (KeyError, TypeError) as e:
                    raise fail(str(e).strip("'\""), f"{where}.tool.fn") from None
        for i, cond in enumerate(node.when):
            if cond.node not in node.inputs:
                raise fail(
                    f"the condition reads {cond.node!r}, which is not an input of this node; "
                    f"its inputs are [{', '.join(node.inputs)}]",
                    f"{where}.when.{i}.node",
                )
            try:
                problem = params_problem(cond.fn, cond.params)
            except UnknownNameError as e:
                raise fail(str(e), f"{where}.when.{i}.fn") from None
            if problem:
                raise fail(problem, f"{where}.when.{i}.params")


def known_conditions() -> list[str]:
    return CONDITIONS.names()
