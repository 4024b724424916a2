"""`bench.sim.balance --small`: the sweep's keys, and balancing never worse than off there."""

from __future__ import annotations

import json
from pathlib import Path

from bench.sim.balance import main


def test_balance_sweep_small_writes_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "balance.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    (row,) = res["rows"]
    assert row["scenario"] == "routed-5" and row["micro_batches"] == 4
    assert row["flex_s"] > 0 and row["flex_nobalance_s"] > 0
    # the simulator is deterministic: in this configuration the balancer has nothing to
    # gain and must not lose (the trial and the step model keep the equal split)
    assert row["balance_gain"] == 1.0 and row["changes"] == 0
