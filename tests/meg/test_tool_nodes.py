"""Tool nodes and conditions: the node kinds of `NodeSpec`, tool agents, conditions on nodes,
and which rollout and selection policies take them (`meg.agentic_checks`), each refusal
naming its field (loops: `test_loops.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from meg import MEGError, MEGSpec
from meg.agentic_checks import check_agentic
from meg.agentic_spec import ToolSpec, WhenSpec
from meg.loops import (
    chain_nodes,
    fill_tool_agents,
    gated,
)
from meg.spec import NodeSpec
from tests.meg.agentic_graphs import load, refused


def _tool(**kw: Any) -> NodeSpec:
    return NodeSpec.model_validate({"tool": {"fn": "calculator"}, **kw})


def test_fill_tool_agents_follows_drivers_through_tools() -> None:
    nodes = {
        "x": NodeSpec(agent="a", template="q"),
        "y": NodeSpec(agent="b", template="q"),
        # the tool reading a tool comes first: filling repeats until nothing changes
        "t2": _tool(inputs={"t1": "per_sample"}),
        "t1": _tool(inputs={"x": "first", "y": "per_sample"}),  # the driver y, not first x
        "t3": _tool(inputs={"x": "first", "y": "all"}),  # no driver: the first input
        "t4": _tool(agent="a", inputs={"y": "per_sample"}),  # explicit: kept
    }
    out = fill_tool_agents(nodes)
    assert {n: s.agent for n, s in out.items()} == {
        "x": "a",
        "y": "b",
        "t2": "b",
        "t1": "b",
        "t3": "a",
        "t4": "a",
    }
    assert nodes["t1"].agent == ""  # the input is not changed


def test_top_level_tool_nodes_take_their_drivers_agent(plain: dict[str, Any]) -> None:
    plain["nodes"]["t2"] = {"tool": {"fn": "calculator"}, "inputs": {"t": "per_sample"}}
    plain["nodes"]["t3"] = {"agent": "b", "tool": {"fn": "lookup"}, "inputs": {"x": "all"}}
    spec = load(plain)
    assert spec.nodes["t"].agent == "a" and spec.nodes["t"].turn is None
    assert spec.nodes["t2"].agent == "a"  # a tool reading a tool inherits
    assert spec.nodes["t3"].agent == "b"  # explicit: kept
    assert spec.node_max_tokens("t") == 0
    assert chain_nodes(spec) == {} and not gated(spec)


def test_tool_node_with_an_explicit_unknown_agent(plain: dict[str, Any]) -> None:
    plain["nodes"]["t"]["agent"] = "zed"
    err = refused(plain)
    assert err.field == "nodes.t.agent" and "unknown agent 'zed'" in str(err)


def test_check_agentic_refuses_a_tool_reaching_no_agent() -> None:
    """Built by hand (`validate` refuses the graphs that get here first: a cycle of tools)."""
    spec = MEGSpec.model_validate(
        {
            "name": "t",
            "agents": {"a": {"model": "hf://o/m"}},
            "nodes": {"t": {"tool": {"fn": "calculator"}, "inputs": {"u": "per_sample"}}},
        }
    )

    def fail(msg: str, field: str) -> MEGError:
        return MEGError(msg, field=field)

    with pytest.raises(MEGError) as ei:
        check_agentic(spec, fail, None)
    assert ei.value.field == "nodes.t.agent" and "give it `agent:`" in str(ei.value)


# --- node kinds -----------------------------------------------------------------------------


def test_a_tool_node_needs_a_tool_name(plain: dict[str, Any]) -> None:
    plain["nodes"]["t"]["tool"] = {}
    err = refused(plain)
    assert err.field == "nodes.t.tool.fn" and "Field required" in str(err)


@pytest.mark.parametrize("fn", ["", "   "])
def test_a_tool_node_with_an_empty_name(plain: dict[str, Any], fn: str) -> None:
    plain["nodes"]["t"]["tool"] = {"fn": fn}
    err = refused(plain)
    assert err.field == "nodes.t.tool.fn" and "must name its tool plug-in (`fn`)" in str(err)


def test_an_unknown_tool_lists_the_known(plain: dict[str, Any]) -> None:
    plain["nodes"]["t"]["tool"] = {"fn": "calculater"}
    err = refused(plain)
    assert err.field == "nodes.t.tool.fn"
    assert "unknown tool 'calculater'" in str(err) and "calculator" in str(err)
    assert "run_tests" in str(err)
    load(plain, known_tools=None)  # None skips the name check


def test_an_unknown_tool_module_is_named(plain: dict[str, Any]) -> None:
    plain["nodes"]["t"]["tool"] = {"fn": "no_such_module_xyz:fn"}
    err = refused(plain)
    assert err.field == "nodes.t.tool.fn" and "cannot import module 'no_such_module_xyz'" in str(
        err
    )


def test_a_tool_params_and_timeout(plain: dict[str, Any]) -> None:
    plain["nodes"]["t"]["tool"] = {"fn": "lookup", "params": {"table": {}}, "timeout_s": 5}
    assert load(plain).nodes["t"].tool == ToolSpec(fn="lookup", params={"table": {}}, timeout_s=5)
    plain["nodes"]["t"]["tool"] = {"fn": "lookup", "timeout_s": 0}
    err = refused(plain)
    assert err.field == "nodes.t.tool.timeout_s" and "greater than 0" in str(err)
    plain["nodes"]["t"]["tool"] = {"fn": "lookup", "timeot_s": 1}
    err = refused(plain)
    assert err.field == "nodes.t.tool.timeot_s" and "Extra inputs are not permitted" in str(err)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"template": "{x}"}, "remove template"),
        ({"n": 2}, "remove n = 2"),
        ({"max_tokens": 8}, "remove max_tokens"),
        ({"chat": {"system": "be brief"}}, "remove chat"),
        ({"inputs": {}}, "give it `inputs`"),
    ],
)
def test_a_tool_node_has_no_llm_fields(
    plain: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    plain["nodes"]["t"].update(extra)
    err = refused(plain)
    assert err.field == "nodes.t" and message in str(err)


def test_a_reward_bound_to_a_tool_node(plain: dict[str, Any]) -> None:
    plain["rewards"]["t"] = {"fn": "exact_answer"}
    err = refused(plain)
    assert err.field == "rewards.t" and "a tool node is not trained" in str(err)


def test_a_reward_bound_to_a_tool_body_node(loop: dict[str, Any]) -> None:
    loop["rewards"]["check"] = {"fn": "exact_answer"}
    err = refused(loop)
    assert err.field == "rewards.check@1" and "takes no reward binding" in str(err)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"template": "hi"}, "a node needs an `agent` (or a `tool`)"),
        ({"agent": "a"}, "a node needs a `template` (or a `tool`)"),
        ({}, "a node needs an `agent`"),
    ],
)
def test_a_plain_node_needs_an_agent_and_a_template(
    plain: dict[str, Any], node: dict[str, Any], message: str
) -> None:
    plain["nodes"]["z"] = node
    err = refused(plain)
    assert err.field == "nodes.z" and message in str(err)


# --- conditions on nodes ------------------------------------------------------------------


def test_a_condition_on_a_node_that_is_not_an_input(plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["when"] = [{"node": "z", "fn": "terminal"}]
    err = refused(plain)
    assert err.field == "nodes.y.when.0.node"
    assert "reads 'z', which is not an input of this node; its inputs are [t, x]" in str(err)


def test_top_level_conditions_load(plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["when"] = [
        {"node": "t", "fn": "terminal", "negate": True},
        {"node": "x", "fn": "matches", "params": {"pattern": r"\d+"}},
    ]
    spec = load(plain)
    assert spec.nodes["y"].when[0] == WhenSpec(node="t", fn="terminal", negate=True)
    assert gated(spec)


def test_an_unknown_condition_lists_the_known(plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["when"] = [{"node": "t", "fn": "terminal"}, {"node": "x", "fn": "has"}]
    err = refused(plain)
    assert err.field == "nodes.y.when.1.fn" and "unknown condition 'has'" in str(err)
    assert "contains" in str(err) and "matches" in str(err) and "terminal" in str(err)


@pytest.mark.parametrize("rounds", [1, 2])
def test_an_unknown_condition_in_until(loop: dict[str, Any], rounds: int) -> None:
    """Checked on the loop itself, so a one-round loop (no gate) is checked too."""
    loop["loops"]["fix"]["rounds"] = rounds
    loop["loops"]["fix"]["until"][0]["fn"] = "has"
    err = refused(loop)
    assert err.field == "loops.fix.until.0.fn" and "unknown condition 'has'" in str(err)
    assert "contains" in str(err)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "missing a required argument: 'text'"),
        ({"text": ""}, "`contains` needs a non-empty string `text`"),
        ({"text": 3}, "`contains` needs a non-empty string `text`"),
        ({"text": "yes", "case": True}, "unexpected keyword argument 'case'"),
    ],
)
def test_contains_params(plain: dict[str, Any], params: dict[str, Any], message: str) -> None:
    plain["nodes"]["y"]["when"] = [{"node": "x", "params": params}]  # fn defaults to contains
    err = refused(plain)
    assert err.field == "nodes.y.when.0.params" and message in str(err)


def test_matches_needs_a_regular_expression(plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["when"] = [{"node": "x", "fn": "matches", "params": {"pattern": "(a"}}]
    err = refused(plain)
    assert err.field == "nodes.y.when.0.params"
    assert "pattern '(a' is not a regular expression" in str(err)


def test_terminal_takes_no_params(plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["when"] = [{"node": "t", "fn": "terminal", "params": {"text": "x"}}]
    err = refused(plain)
    assert err.field == "nodes.y.when.0.params" and "cannot take params" in str(err)


def test_bad_until_params(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["until"][0]["params"] = {"text": ""}
    err = refused(loop)
    assert err.field == "loops.fix.until.0.params" and "non-empty string" in str(err)


def test_a_misspelt_condition_key(plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["when"] = [{"node": "x", "negated": True}]
    err = refused(plain)
    assert err.field == "nodes.y.when.0.negated"
