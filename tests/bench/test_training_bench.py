"""The training benchmark runs at small size and reports sane values (never timings)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.training import main

KEYS = {
    "train_tok_s",
    "swap_ms",
    "swap_ratio_vs_copy",
    "grad_accum_overhead",
    "swap_ms_url",
    "swap_ratio_vs_copy_url",
}


def test_small_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "training.json"
    res = main(["--small", "--threads", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert res.keys() >= KEYS
    for k in KEYS:
        v = res[k]
        assert isinstance(v, float) and v > 0, k
    mb = res["state_mb"]
    assert res["size"] == "small" and isinstance(mb, float) and mb > 0
