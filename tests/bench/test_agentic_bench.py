"""A small run of the agentic benchmark: its keys and what holds whatever the timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.agentic import ARMS, main

pytestmark = pytest.mark.slow


def test_agentic_bench_small(tmp_path: Path, cluster: str) -> None:
    """On the session's Prefect server and default cluster (what `--small` would start)."""
    out = tmp_path / "agentic.json"
    res = main(["--small", "--scheduler", cluster, "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert set(res["arms"]) == set(ARMS)
    for key in ("early_stop_step_time_ratio", "flex_over_sync_agentic"):
        assert res[key] > 0
    for key in ("heldout_pass_rate_before", "heldout_pass_rate_after"):
        assert 0.0 <= res[key] <= 1.0
    assert all(r["violations"] == 0 for r in res["arms"].values())
    # a loop forced to its bound runs every round; the reviewer may stop the others early
    assert res["arms"]["forced"]["rounds_taken"] == 1.0
    assert res["arms"]["early"]["rounds_taken"] <= 1.0
    assert {"final_reward", "solved", "repaired"} <= set(res["arms"]["crbc"]["heldout"])
    # the machine's cores over each run (bench.cores), and the bound they set
    for r in res["arms"].values():
        assert 0 < r["cores_busy"] <= res["cpus"] + 0.05 and r["work_core_s"] > 0
    early, sync = res["arms"]["early"], res["arms"]["sync"]
    assert res["bound_flex_over_sync_agentic"] == pytest.approx(
        sync["step_s"] * res["cpus"] / early["work_core_s"], rel=1e-2
    )
