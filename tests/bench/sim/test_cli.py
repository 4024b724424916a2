"""`python -m bench.sim --small` end to end: the JSON the issue asks for, the plots, and the
direction of the paper-scale ratios (simulated seconds: deterministic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.cli import main
from bench.sim.paper import KEYS


def test_sim_cli_small_writes_the_json_and_plots(tmp_path: Path) -> None:
    e2e = tmp_path / "e2e.json"  # a measured run, as bench/e2e.py writes it (tiny sizes)
    arms = {
        "sync": {"step_s": 2.0},
        "flex": {"step_s": 1.5},
        "flex-prefect-per-node": {"step_s": 4.0},
    }
    e2e.write_text(
        json.dumps(
            {"steps": 2, "episodes_per_step": 2, "workloads": {"math-chain": {"arms": arms}}}
        )
    )
    out = tmp_path / "sim.json"
    res = main(
        ["--small", "--json", str(out), "--e2e", str(e2e), "--heldout", str(tmp_path / "no")]
    )
    assert json.loads(out.read_text()) == res
    assert {"date", "machine"} <= set(res)
    assert set(res["calibration_error"]) == {"math-chain/sync", "math-chain/flex"}  # no Prefect arm
    for err in res["calibration_error"].values():
        assert isinstance(err, float)
    (row,) = res["scenarios"].values()
    for key in (*KEYS.values(), "speedup_vs_sync", "speedup_vs_marti"):
        assert row[key] > 0
    assert set(row["utilization"]) == set(KEYS)
    assert all(0 < u <= 1 for u in row["utilization"].values())
    assert row["speedup_vs_sync"] == pytest.approx(row["sync_s"] / row["flex_s"], rel=0.01)
    # the headline ratios' direction at paper scale (chain-3 on 64 accelerators: 1.51x and
    # 1.08x): flex beats sync and, from 3 agents, MARTI's schedule
    assert row["speedup_vs_sync"] > 1 and row["speedup_vs_marti"] > 1
    for point in (*res["curves"]["agents"], *res["curves"]["accelerators"]):
        assert point["flex_s"] < point["sync_s"], point
        if point["agents"] >= 3:
            assert point["flex_s"] < point["marti_like_s"], point
    # one agent: MARTI's colocation gives both roles every device, our disaggregated layout
    # half of them to each role, and it loses (physics.py: nothing divides a replica's load)
    (one,) = [p for p in res["curves"]["agents"] if p["agents"] == 1]
    assert one["marti_like_s"] < one["flex_s"]
    for name in ("sim_scaling_agents.png", "sim_scaling_accelerators.png"):
        assert (tmp_path / name).stat().st_size > 1000
