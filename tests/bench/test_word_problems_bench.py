"""A small run of the word-problems benchmark keeps it working (keys and consistency, never
whether a 1-step run learned: the headline, the held-out team reward rising 0.627 -> 0.856
after 60 steps, is not a direction 1 RL step after a 2-step warm start shows; on 8
held-out problems one greedy answer moves the score by 0.125)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.word_problems import main

pytestmark = pytest.mark.slow


def test_word_problems_bench_small(tmp_path: Path, cluster: str) -> None:
    """Trained on the session's cluster (`flexmarl train --scheduler`), not on a three-worker
    one of its own: the layout is not what this run checks."""
    out = tmp_path / "wp.json"
    args = ["--warm-steps", "2", "--steps", "1", "--episodes", "2", "--eval-limit", "8"]
    args += ["--repeats", "2", "--scheduler", cluster]
    res = main([*args, "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert (res["warm_steps"], res["rl_steps"], res["episodes_per_step"]) == (2, 1, 2)
    (seed,) = res["seeds"]
    assert seed["held_out_tasks"] == 8 and seed["violations"] == 0 and res["repeats"] == 2
    for how in ("greedy", "sampled"):
        for side in ("before", "after"):
            assert set(seed[side][how]["agents"]) == {"solver", "verifier", "reviser"}
            assert 0.0 <= seed[side][how]["team"] <= 1.0 and seed[side][how]["tasks"] == 8
        delta = seed["after"][how]["team"] - seed["before"][how]["team"]
        assert seed["delta_team"][how] == pytest.approx(delta, abs=1e-4)
        assert res["mean_delta_team"][how] == pytest.approx(seed["delta_team"][how])
