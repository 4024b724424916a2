"""A small run of the end-to-end benchmark keeps it working (keys and sanity, no timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.e2e import ARMS, main

pytestmark = pytest.mark.slow


def test_e2e_bench_small(tmp_path: Path, prefect_server: str) -> None:
    out = tmp_path / "e2e.json"
    res = main(["--small", "--workloads", "math-chain", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    r = res["workloads"]["math-chain"]
    assert set(r["arms"]) == set(ARMS)
    for arm in r["arms"].values():
        assert arm["step_s"] > 0 and 0 < arm["utilization"] <= 1
        assert arm["violations"] == 0
    for key in ("speedup_flex_vs_sync", "balance_gain", "async_gain", "prefect_overhead"):
        assert isinstance(r[key], float)
