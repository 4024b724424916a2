"""The compaction benchmark's --small run: its keys, and that the two profiles are what
they say (lengths spread under `longtail`, to the budget under `full`); never timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.compaction import main, stop_tokens

pytestmark = pytest.mark.slow


def test_compaction_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "compaction.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert list(res["sizes"]) == ["toy"] and res["completions"] == 64
    toy = res["sizes"]["toy"]
    for profile in ("longtail", "full"):
        row = toy[profile]
        g = row["generate_s"]
        assert g["compact"] > 0 and g["all_rows"] > 0
        assert row["compaction_time_ratio"] == pytest.approx(g["compact"] / g["all_rows"], abs=2e-3)
    # stop tokens end rows early under `longtail`; without them rows run (nearly) to the end
    assert toy["longtail"]["mean_length"] < 0.9 * 32 <= toy["full"]["mean_length"]
    assert res["compaction_time_ratio"] == toy["longtail"]["compaction_time_ratio"]
    assert res["compaction_full_time_ratio"] == toy["full"]["compaction_time_ratio"]


def test_the_longtail_profile_stops_on_a_64th_of_the_vocabulary() -> None:
    assert len(stop_tokens("longtail", 512)) == 8 and min(stop_tokens("longtail", 512)) == 100
    assert stop_tokens("full", 512) == ()
