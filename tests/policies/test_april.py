"""`april`: the launch count and its inverse, and the graphs it refuses (it cuts at the
one root, and does not carry the skipped rounds of tool or conditional nodes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meg.policies import AprilRollout, FullRollout
from policies import problems
from policies.april import April
from policies.base import NodeRequests
from tests.meg.agentic_graphs import load as agentic
from tests.meg.agentic_graphs import refused as agentic_refused
from tests.policies.conftest import load, refused

OVER_PROVISION = [0.01, 0.05, 0.1, 0.25, 1 / 3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.3, 4.0]


@pytest.mark.parametrize("over", OVER_PROVISION)
def test_april_quota_inverts_launched(over: float) -> None:
    policy = April(AprilRollout(policy="april", over_provision=over))
    for q in range(200):
        launched = policy.launched(q)
        assert launched >= q and (launched > q or q == 0)
        assert policy.quota(launched) == q, (over, q, launched)
    for n in range(1, 120):  # fewer launched (prompts skipped): a quota that fits, at least 1
        q = policy.quota(n)
        assert 1 <= q <= n
        assert q == 1 or policy.launched(q) <= n < policy.launched(q + 1)
    assert policy.quota(0) == 0


def test_april_default_over_provision_trains_the_planned_share() -> None:
    """The defaults (25 %): 1 planned episode launches 2 and still trains 1, 5 launch 7."""
    policy = April(AprilRollout(policy="april"))
    assert [(policy.launched(q), policy.quota(policy.launched(q))) for q in (1, 4, 5)] == [
        (2, 1),
        (5, 4),
        (7, 5),
    ]


def test_april_carries_for_max_carry_steps(base: dict[str, Any], tmp_path: Path) -> None:
    base["run"] = {"rollout": {"policy": "april", "max_carry": 2}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout.carries and rollout.carry_limit == 2


def test_april_is_refused_on_a_graph_with_two_roots(base: dict[str, Any], tmp_path: Path) -> None:
    base["run"] = {"rollout": {"policy": "april"}}
    load(base, tmp_path)  # one root (x): accepted
    base["nodes"]["z"] = {"agent": "b", "template": "Q: {question}", "n": 2}
    err = refused(base, tmp_path)
    assert err.field == "run.rollout"
    assert "april" in str(err) and "2 nodes without inputs (x, z)" in str(err)
    assert "policy: full" in str(err)
    base["run"] = {"rollout": {"policy": "full"}}
    assert load(base, tmp_path).run.rollout == FullRollout()  # full runs any graph


def test_april_refuses_tool_nodes(plain: dict[str, Any]) -> None:
    plain["run"] = {"rollout": {"policy": "april"}}
    err = agentic_refused(plain, policy_problems=problems)
    assert err.field == "run.rollout"
    assert "april" in str(err) and "tool or conditional nodes (t)" in str(err)


def test_april_refuses_conditional_nodes(plain: dict[str, Any]) -> None:
    plain["nodes"]["t"] = {"agent": "a", "template": "{x}", "inputs": {"x": "per_sample"}}
    plain["run"] = {"rollout": {"policy": "april"}}
    agentic(plain, policy_problems=problems)  # no tool, no condition: april takes it
    plain["nodes"]["y"]["when"] = [{"node": "t", "params": {"text": "go"}}]
    err = agentic_refused(plain, policy_problems=problems)
    assert err.field == "run.rollout" and "conditional nodes (y)" in str(err)


def test_april_refuses_a_loop(loop: dict[str, Any]) -> None:
    loop["run"] = {"rollout": {"policy": "april"}}
    err = agentic_refused(loop, policy_problems=problems)
    assert err.field == "run.rollout" and "check@1" in str(err)


def test_april_samples_plainly_where_it_does_not_cut() -> None:
    """Its cut is the root task's mechanism (`tasks.carry`): no watch, no draft."""
    april = April(AprilRollout(policy="april"))
    assert april.watch(NodeRequests(4, [], lambda text, task: True, str)) is None
    assert april.speculation(64) is None
