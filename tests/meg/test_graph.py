"""Score groups: which nodes are scored together, when, and what their rewards see."""

from __future__ import annotations

from typing import Any

import pytest

from flows.orchestrator.planning import scoring_plan
from meg import ScoreGroup, ancestors, build_spec, load_meg, score_groups
from workloads import BUILTIN
from workloads.rewards import known_rewards


def plan(name: str) -> tuple[ScoreGroup, ...]:
    return scoring_plan(load_meg(BUILTIN[name], known_rewards=known_rewards(), check_models=False))


def test_builtin_workloads_score_each_node_as_soon_as_it_can() -> None:
    # fan-out: a worker's exact_answer needs only the worker's answer; the planner's team
    # reward and the aggregator wait for the final node and see the whole episode
    assert plan("fanout") == (
        ScoreGroup(("work_s",), ("work_s",), ("work_s",)),
        ScoreGroup(("work_m",), ("work_m",), ("work_m",)),
        ScoreGroup(("work_l",), ("work_l",), ("work_l",)),
        ScoreGroup(
            ("plan", "aggregate"),
            ("aggregate",),
            ("plan", "work_s", "work_m", "work_l", "aggregate"),
        ),
    )
    # math-chain: the solver is scored before the verifier answers; the verdict sees the solve
    assert plan("math-chain") == (
        ScoreGroup(("solve",), ("solve",), ("solve",)),
        ScoreGroup(("verify",), ("verify",), ("solve", "verify")),
    )
    # debate: every reward is the team's, so one group after the final answer
    (only,) = plan("debate")
    assert only.waits == ("final",) and set(only.nodes) == set(only.loads) == {
        "alice@1",
        "bob@1",
        "alice@2",
        "bob@2",
        "final",
    }


def test_whole_episode_waits_for_every_sink(base: dict[str, Any]) -> None:
    """Two sinks: a reward that reads everything must wait for both, not the last one."""
    base["nodes"]["z"] = {"agent": "b", "template": "{x} no?", "n": 1, "inputs": {"x": "best"}}
    spec = build_spec(base)
    assert ancestors(spec, {"y", "z"}) == {"x"}
    (whole,) = score_groups(spec, dict.fromkeys(spec.nodes))
    assert set(whole.waits) == {"y", "z"} and set(whole.nodes) == {"x", "y", "z"}
    # y and z read nothing: each is its own group; x reads z so it waits for z
    groups = score_groups(spec, {"x": {"z"}})
    assert [(g.nodes, g.waits) for g in groups] == [(("y",), ("y",)), (("x", "z"), ("z",))]


def test_reading_an_unknown_node_is_a_clear_error(base: dict[str, Any]) -> None:
    spec = build_spec(base)
    with pytest.raises(ValueError, match="the reward of node 'y' reads 'w', which is not in"):
        score_groups(spec, {"y": {"w"}})
    base["rewards"]["y"] = {"fn": "team_final", "params": {}}
    with pytest.raises(ValueError, match=r"rewards\.y: reward 'team_final' needs the parameter"):
        scoring_plan(build_spec(base))
