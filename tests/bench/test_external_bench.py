"""A small run of the external-policy benchmark: its keys, both arms trained and evaluated
held out, the external arm's share of rows from the teacher (one of each group of 4 the
counter trained), and the untrained models' held-out rewards (counts and bounds, never a
reward threshold)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.external import ARMS, main
from tests.tasks.conftest import tiny_model  # noqa: F401  (a fixture: the learner here)

pytestmark = pytest.mark.slow


def test_external_bench_small(
    tmp_path: Path, longtail_model: str, cluster: str, request: pytest.FixtureRequest
) -> None:
    tiny = request.getfixturevalue("tiny_model")  # the seed-0 tiny model: a weak learner
    out = tmp_path / "external.json"
    argv = ["--small", "--learner", tiny, "--teacher", longtail_model]
    res = main([*argv, "--json", str(out), "--scheduler", cluster])
    assert json.loads(out.read_text()) == res
    assert set(res["heldout_reward"]) == set(res["sampled_tokens"]) == set(ARMS)
    assert all(len(v) == 1 and 0 <= v[0] <= 1 for v in res["heldout_reward"].values())
    assert all(len(v) == 1 and v[0] > 0 for v in res["sampled_tokens"].values())
    assert res["external_row_share"] == 0.25  # 1 of every group of 4
    assert 0 < res["external_token_frac"] < 1
    assert 0 <= res["teacher_heldout"] <= 1 and 0 <= res["learner_base_heldout"] <= 1
    assert res["learner_warm_steps"] is None  # given, not built here
    assert res["external_reward_delta"] == round(
        res["heldout_reward"]["external"][0] - res["heldout_reward"]["on_policy"][0], 4
    )
