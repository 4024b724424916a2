"""The failure rules (`run.scoring.on_failure`) and the failure budget, as pure functions."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.failures import (
    FailureBudget,
    NodeScores,
    TooManyRewardFailures,
    apply_failure_rule,
    over_budget,
)

NAN = float("nan")
GROUPS = np.asarray(["g0", "g0", "g1", "g1", "g2"])


def raw() -> NodeScores:
    """Row 1 (group g0) failed; the others scored."""
    return NodeScores(
        np.asarray([1.0, NAN, 0.0, 1.0, 0.5], np.float32), [None, "ValueError: x", None, None, None]
    )


def test_zero_scores_a_failed_sample_0_and_keeps_its_group() -> None:
    out = apply_failure_rule("zero", raw(), GROUPS)
    assert out.reward.tolist() == [1.0, 0.0, 0.0, 1.0, 0.5]
    assert out.status.tolist() == ["ok", "failed: ValueError: x", "ok", "ok", "ok"]
    assert out.used.all()


def test_drop_group_drops_the_whole_group_of_a_failed_sample() -> None:
    out = apply_failure_rule("drop_group", raw(), GROUPS)
    assert np.isnan(out.reward[1]) and out.reward[[0, 2, 3, 4]].tolist() == [1.0, 0.0, 1.0, 0.5]
    assert out.status.tolist() == [
        "dropped: a reward call of its group failed",
        "failed: ValueError: x",
        "ok",
        "ok",
        "ok",
    ]
    assert out.used.tolist() == [False, False, True, True, True]


@pytest.mark.parametrize("rule", ["zero", "drop_group"])
def test_without_failures_both_rules_change_nothing(rule: str) -> None:
    scores = NodeScores(np.asarray([1.0, 0.0], np.float32), [None, None])
    out = apply_failure_rule(rule, scores, np.asarray(["g", "g"]))
    assert out.reward.tolist() == [1.0, 0.0] and out.used.all()
    assert out.status.tolist() == ["ok", "ok"]


def test_an_unbound_node_is_scored_zero_without_failures() -> None:
    n = NodeScores.unscored(3)
    assert n.reward.tolist() == [0.0] * 3 and n.failed == 0


@pytest.mark.parametrize(
    "failed, scored, expected",
    [(0, 100, False), (20, 100, False), (21, 100, True), (49, 49, False), (11, 50, True)],
)
def test_over_budget(failed: int, scored: int, expected: bool) -> None:
    assert over_budget(failed, scored, 0.2, 50) is expected


def test_the_budget_counts_the_whole_run_and_names_the_agents() -> None:
    budget = FailureBudget(0.25, min_samples=8)
    budget.add(0, 4, {"solver": 2})  # half failed, but too few samples to judge
    budget.add(0, 4, {})  # 2 of 8
    assert budget.failed == {"solver": 2}
    budget.add(1, 4, {"judge": 1})  # 3 of 12: at the fraction, not over it
    with pytest.raises(TooManyRewardFailures, match=r"5 of 16 .* step 2 \(judge 3, solver 2\)"):
        budget.add(2, 4, {"judge": 2})
