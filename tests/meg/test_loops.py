"""Bounded loops: unrolling (`meg.loops`) of the code-repair workload and of a small loop,
its helpers, and the loop rules of `meg.agentic_checks`, each refusal naming its field
(tool nodes and conditions: `test_tool_nodes.py`)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from meg import MEGSpec, build_spec, validate
from meg.agentic_spec import LoopSpec, ToolSpec, TurnOf, WhenSpec
from meg.loops import (
    chain_nodes,
    expand_bound,
    expand_rewards,
    gated,
    loop_nodes,
    rename_placeholders,
    round_name,
    unroll_loop,
)
from meg.sizes import episode_samples
from meg.spec import RewardSpec
from tests.meg.agentic_graphs import LOOP, load, refused
from workloads import BUILTIN
from workloads.rewards import known_rewards
from workloads.tools import known_tools


def code_repair() -> MEGSpec:
    data = yaml.safe_load(BUILTIN["code-repair"].read_text())
    return validate(
        build_spec(data),
        known_rewards=known_rewards(),
        known_tools=known_tools(),
        check_models=False,
    )


# --- the code-repair workload, unrolled --------------------------------------------------

ROUNDS = ["code@1", "test@1", "review@1", "code@2", "test@2", "review@2"]
ROUNDS += ["code@3", "test@3", "review@3"]


def test_code_repair_unrolls_into_three_rounds_in_order() -> None:
    spec = code_repair()
    assert list(spec.nodes) == ROUNDS
    assert spec.loops == {}  # unrolled: what is left is a plain MEG
    assert spec.run.select.policy == "all"


def test_code_repair_first_round_is_the_body_as_written() -> None:
    nodes = code_repair().nodes
    code = nodes["code@1"]
    assert code.agent == "coder" and code.n == 4 and code.inputs == {} and code.when == []
    assert code.template == "Q: {question}\nA:"
    assert nodes["test@1"].inputs == {"code@1": "per_sample"}
    assert nodes["review@1"].inputs == {"test@1": "per_sample", "code@1": "first"}
    assert nodes["review@1"].when == []


def test_code_repair_later_rounds_reenter_at_code_gated_on_the_previous_review() -> None:
    nodes = code_repair().nodes
    for r in (2, 3):
        prev = r - 1
        code = nodes[f"code@{r}"]
        assert code.agent == "coder" and code.n == 1
        assert code.inputs == {
            f"review@{prev}": "per_sample",
            f"code@{prev}": "first",
            f"test@{prev}": "first",
        }
        assert code.template == f"Q: {{question}}\nA:{{code@{prev}}}\nT:{{test@{prev}}}\nFix:"
        assert code.when == [
            WhenSpec(node=f"review@{prev}", fn="contains", params={"text": "yes"}, negate=True)
        ]


def test_code_repair_tool_rounds_store_under_the_coder() -> None:
    spec = code_repair()
    for r in (1, 2, 3):
        test = spec.nodes[f"test@{r}"]
        assert test.is_tool and test.tool == ToolSpec(fn="run_tests")
        assert test.agent == "coder"  # fill_tool_agents: the driver code@r's agent
        assert test.template == "" and test.n == 1
        assert test.inputs == {f"code@{r}": "per_sample"}
        assert spec.node_max_tokens(f"test@{r}") == 0  # a tool decodes nothing
    assert spec.node_max_tokens("code@1") == 28 and spec.node_max_tokens("review@2") == 3


def test_code_repair_review_reads_its_own_round() -> None:
    nodes = code_repair().nodes
    for r in (1, 2, 3):
        review = nodes[f"review@{r}"]
        assert review.agent == "reviewer"
        assert review.template == f"Q: {{question}}\nA:{{code@{r}}}\nT:{{test@{r}}}\nOK?"
        assert review.inputs == {f"test@{r}": "per_sample", f"code@{r}": "first"}


def test_code_repair_every_node_knows_its_turn() -> None:
    spec = code_repair()
    for name, node in spec.nodes.items():
        body, r = name.split("@")
        assert node.turn == TurnOf(loop="repair", body=body, round=int(r), entry="code")
    assert loop_nodes(spec, "repair") == ROUNDS
    assert loop_nodes(spec, "other") == []
    assert chain_nodes(spec) == {  # tool rounds are no agent's turns
        ("repair", "code"): ["code@1", "code@2", "code@3"],
        ("repair", "review"): ["review@1", "review@2", "review@3"],
    }
    assert gated(spec)


def test_code_repair_rewards_and_team_nodes_cover_every_round() -> None:
    spec = code_repair()
    assert set(spec.rewards) == {f"{b}@{r}" for b in ("code", "review") for r in (1, 2, 3)}
    for r in (1, 2, 3):
        # a param naming a body node names the same round's node
        assert spec.rewards[f"code@{r}"] == RewardSpec(
            fn="tests_passed", params={"target": f"test@{r}"}
        )
        assert spec.rewards[f"review@{r}"] == RewardSpec(
            fn="repair_verdict", params={"target": f"test@{r}"}
        )
    assert spec.team_nodes == ["code@1", "code@2", "code@3"]


def test_code_repair_counts_four_samples_per_node() -> None:
    spec = code_repair()
    # round 1: 4 codes, a test and a review each; round r > 1: one repair per review
    assert episode_samples(spec) == dict.fromkeys(ROUNDS, 4)


def test_unrolled_spec_round_trips_through_its_dump() -> None:
    """Run records store `spec.model_dump()`; reading one back must give the same MEG."""
    spec = code_repair()
    again = MEGSpec.model_validate(spec.model_dump())
    assert again == spec
    assert list(again.nodes) == ROUNDS and again.nodes["code@2"].turn is not None
    revalidated = validate(
        again, known_rewards=known_rewards(), known_tools=known_tools(), check_models=False
    )
    assert revalidated == spec
    # and as JSON (what a run record is written as)
    assert MEGSpec.model_validate_json(spec.model_dump_json()) == spec


# --- a small loop -------------------------------------------------------------------------


def test_small_loop_unrolls_and_loads(loop: dict[str, Any]) -> None:
    spec = load(loop)
    assert list(spec.nodes) == ["act@1", "check@1", "judge@1", "act@2", "check@2", "judge@2"]
    assert spec.nodes["check@2"].agent == "a"
    assert spec.nodes["act@2"].template == "{act@1} {check@1} {judge@1} again:"
    assert set(spec.rewards) == {"act@1", "act@2"}
    assert spec.team_nodes is None


def test_one_round_has_no_gate(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["rounds"] = 1
    spec = load(loop)
    assert list(spec.nodes) == ["act@1", "check@1", "judge@1"]
    assert not gated(spec)


def test_a_body_nodes_own_condition_reads_its_round_and_the_gate_follows(
    loop: dict[str, Any],
) -> None:
    own = {"node": "judge", "fn": "contains", "params": {"text": "maybe"}}
    loop["loops"]["fix"]["again"]["act"]["when"] = [own]
    loop["loops"]["fix"]["body"]["judge"]["when"] = [{"node": "check", "fn": "terminal"}]
    spec = load(loop)
    assert spec.nodes["judge@2"].when == [WhenSpec(node="check@2", fn="terminal")]
    assert spec.nodes["act@2"].when == [
        WhenSpec(node="judge@1", params={"text": "maybe"}),  # again's own, previous round
        WhenSpec(node="judge@1", params={"text": "yes"}, negate=True),  # the gate
    ]


def test_a_negated_until_gates_on_the_plain_condition(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["until"] = [
        {"node": "check", "fn": "terminal"},
        {"node": "judge", "params": {"text": "fail"}, "negate": True},
    ]
    spec = load(loop)
    assert spec.nodes["act@2"].when == [
        WhenSpec(node="check@1", fn="terminal", negate=True),
        WhenSpec(node="judge@1", params={"text": "fail"}, negate=False),
    ]


def test_body_nodes_may_read_top_level_nodes(loop: dict[str, Any]) -> None:
    loop["nodes"] = {"plan": {"agent": "b", "template": "plan {question}"}}
    body = loop["loops"]["fix"]["body"]
    body["act"]["inputs"] = {"plan": "first"}
    body["act"]["template"] = "{plan} Q: {question}"
    loop["team_nodes"] = ["plan", "judge"]
    spec = load(loop)
    assert spec.nodes["act@1"].inputs == {"plan": "first"}
    assert spec.nodes["act@1"].template == "{plan} Q: {question}"
    assert spec.team_nodes == ["plan", "judge@1", "judge@2"]


def test_unroll_loop_directly() -> None:
    nodes = unroll_loop("fix", LoopSpec.model_validate(LOOP["loops"]["fix"]))
    assert list(nodes) == [round_name(b, r) for r in (1, 2) for b in ("act", "check", "judge")]
    assert nodes["check@1"].agent == ""  # filled later, by fill_tool_agents
    assert nodes["judge@2"].turn == TurnOf(loop="fix", body="judge", round=2, entry="act")


# --- unit helpers -------------------------------------------------------------------------


def test_rename_placeholders_keeps_literals_and_unknown_names() -> None:
    names = {"code": "code@2", "test": "test@2"}
    assert rename_placeholders("{code}|{test}|{other}", names) == "{code@2}|{test@2}|{other}"
    assert rename_placeholders("{{code}} {code}", names) == "{{code}} {code@2}"
    assert rename_placeholders("{question} {{literal}}", names) == "{question} {{literal}}"
    assert rename_placeholders("no placeholders {", names) == "no placeholders {"


def test_expand_bound_and_rewards() -> None:
    loops = {"fix": LoopSpec.model_validate(LOOP["loops"]["fix"])}
    assert expand_bound(["plan", "judge", "act"], loops) == [
        "plan",
        "judge@1",
        "judge@2",
        "act@1",
        "act@2",
    ]
    rewards = {
        "plan": RewardSpec(fn="r", params={"target": "check"}),  # not a body node: as is
        "judge": RewardSpec(fn="v", params={"target": "check", "k": 3, "other": "plan"}),
    }
    out = expand_rewards(rewards, loops)
    assert out["plan"] == rewards["plan"]
    assert out["judge@2"] == RewardSpec(
        fn="v", params={"target": "check@2", "k": 3, "other": "plan"}
    )
    assert list(out) == ["plan", "judge@1", "judge@2"]


# --- loop refusals --------------------------------------------------------------------------


def test_a_loop_needs_rounds(loop: dict[str, Any]) -> None:
    del loop["loops"]["fix"]["rounds"]
    err = refused(loop)
    assert err.field == "loops.fix.rounds" and "Field required" in str(err)


@pytest.mark.parametrize(
    ("rounds", "message"), [(0, "greater than or equal to 1"), (101, "less than or equal to 100")]
)
def test_rounds_out_of_range(loop: dict[str, Any], rounds: int, message: str) -> None:
    loop["loops"]["fix"]["rounds"] = rounds
    err = refused(loop)
    assert err.field == "loops.fix.rounds" and message in str(err)


@pytest.mark.parametrize("key", ["body", "again", "until"])
def test_a_loop_needs_its_parts(loop: dict[str, Any], key: str) -> None:
    del loop["loops"]["fix"][key]
    err = refused(loop)
    assert err.field == f"loops.fix.{key}" and "Field required" in str(err)


def test_a_misspelt_loop_key(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["round"] = 2
    err = refused(loop)
    assert err.field == "loops.fix.round" and "Extra inputs are not permitted" in str(err)


def test_again_names_two_nodes(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["again"]["judge"] = {"n": 1}
    err = refused(loop)
    assert err.field == "loops.fix.again" and "`again` names 2 nodes" in str(err)
    assert "exactly one body node" in str(err)


def test_again_names_a_node_outside_the_body(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["again"] = {"plan": {"n": 1}}
    err = refused(loop)
    assert err.field == "loops.fix.again"
    assert "'plan', which is not a body node (act, check, judge)" in str(err)


def test_until_names_a_node_outside_the_body(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["until"].append({"node": "plan", "fn": "terminal"})
    err = refused(loop)
    assert err.field == "loops.fix.until.1.node"
    assert "`until` reads 'plan', which is not a body node" in str(err)


def test_until_reads_a_node_the_again_node_does_not_see(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["again"]["act"]["inputs"] = {"check": "per_sample", "act": "first"}
    loop["loops"]["fix"]["again"]["act"]["template"] = "{act} {check} again:"
    err = refused(loop)
    assert err.field == "loops.fix.until.0.node"
    assert "which `again.act` does not take as an input" in str(err)
    assert "add `judge: first`" in str(err)


def test_a_body_name_with_an_at(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["note@x"] = {
        "agent": "b",
        "template": "{act}",
        "inputs": {"act": "first"},
    }
    err = refused(loop)
    assert err.field == "loops.fix.body.note@x" and "may not contain `@`" in str(err)


def test_a_body_node_that_does_not_descend_from_the_entry(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["side"] = {"agent": "b", "template": "side {question}"}
    err = refused(loop)
    assert err.field == "loops.fix.body"
    assert "body node(s) side do not read the round's entry 'act'" in str(err)
    loop["loops"]["fix"]["rounds"] = 1  # one round: nothing to skip, so nothing to check
    assert "side@1" in load(loop).nodes


def test_a_body_name_that_is_also_a_top_level_node(loop: dict[str, Any]) -> None:
    loop["nodes"] = {"judge": {"agent": "b", "template": "{question}"}}
    err = refused(loop)
    assert err.field == "loops.fix.body"
    assert "body node(s) judge are also top-level nodes" in str(err)


def test_a_loop_unrolling_onto_a_defined_node(loop: dict[str, Any]) -> None:
    loop["nodes"] = {"act@2": {"agent": "b", "template": "{question}"}}
    err = refused(loop)
    assert err.field == "loops.fix" and "duplicate node name 'act@2'" in str(err)


def test_a_body_node_that_is_not_a_valid_node(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["check"]["n"] = 3
    err = refused(loop)
    assert err.field == "loops.fix.body.check" and "remove n = 3" in str(err)


def test_a_body_tool_without_fn_names_the_field(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["check"]["tool"] = {}
    err = refused(loop)
    assert err.field == "loops.fix.body.check.tool.fn" and "Field required" in str(err)


def test_an_invalid_again_field_names_the_again_node(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["again"]["act"]["n"] = 0
    err = refused(loop)
    assert err.field == "loops.fix.again.act.n" and "n must be at least 1 (got 0)" in str(err)


@pytest.mark.parametrize("inputs", ["act", None, ["act"]])
def test_body_inputs_that_are_not_a_mapping(loop: dict[str, Any], inputs: Any) -> None:
    loop["loops"]["fix"]["body"]["check"]["inputs"] = inputs
    err = refused(loop)
    assert err.field == "loops.fix.body.check"
    assert "`inputs` maps input nodes to fan-out rules" in str(err)


def test_body_when_that_is_not_a_list(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["judge"]["when"] = None
    err = refused(loop)
    assert err.field == "loops.fix.body.judge" and "`when` is a list of conditions" in str(err)


def test_a_loop_unrolling_past_the_node_limit(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["rounds"] = 100
    for i in range(8):
        loop["loops"]["fix"]["body"][f"extra{i}"] = {
            "agent": "b",
            "template": "{act}",
            "inputs": {"act": "first"},
        }
    err = refused(loop)
    assert err.field == "loops" and "the limit is 1,000" in str(err)


# --- defects found while writing these tests (now fixed) ------------------------------


def test_again_inputs_that_are_not_a_mapping(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["again"]["act"]["inputs"] = None
    err = refused(loop)
    assert err.field == "loops.fix.again.act.inputs"
    assert "`inputs` maps input nodes to fan-out rules, got None" in str(err)


def test_a_null_body_template_is_refused(loop: dict[str, Any], plain: dict[str, Any]) -> None:
    plain["nodes"]["y"]["template"] = None
    assert refused(plain).field == "nodes.y.template"
    loop["loops"]["fix"]["body"]["judge"]["template"] = None
    err = refused(loop)
    assert err.field == "loops.fix.body.judge.template" and "valid string" in str(err)


def test_a_misspelt_body_condition_key_names_its_index(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["judge"]["when"] = [{"node": "check", "negated": True}]
    err = refused(loop)
    assert err.field == "loops.fix.body.judge.when.0.negated"
    assert "Extra inputs are not permitted" in str(err)


def test_a_body_node_named_question_is_refused(loop: dict[str, Any]) -> None:
    loop["loops"]["fix"]["body"]["question"] = {
        "agent": "b",
        "template": "ask {act}",
        "inputs": {"act": "first"},
    }
    err = refused(loop)
    assert err.field == "loops.fix.body.question"
    assert "`{question}` is a reserved placeholder" in str(err)
