"""A small run of the stop-mechanism benchmark (abort vs chunked decoding): keys, and that
its arms sample what they claim (never timings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.cut import main

pytestmark = pytest.mark.slow


def test_cut_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "cut.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    arms = res["arms"]
    assert set(arms) == {"full", "step_loop", "abort", "chunked_8", "chunked_16", "chunked_32"}
    # the step loop with nothing to cut samples exactly what LLM.generate samples
    assert arms["step_loop"]["tokens"] == arms["full"]["tokens"]
    assert arms["full"]["partial_tokens"] == arms["step_loop"]["partial_tokens"] == 0
    # the cut stops requests, so it never generates more than running all to their end
    assert arms["abort"]["tokens"] <= arms["full"]["tokens"]
    assert all(a["calls"] >= 1 for a in arms.values())
    for key in ("step_loop_overhead", "abort_time_ratio", "chunked_time_ratio"):
        assert math.isfinite(res[key]) and res[key] > 0
