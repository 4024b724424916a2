"""A small run of the long-tail benchmark keeps it working (keys, audits, the fractions;
never timings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.longtail import ARMS, WORKLOADS, main

pytestmark = pytest.mark.slow


def test_longtail_bench_small(tmp_path: Path, prefect_server: str) -> None:
    out = tmp_path / "longtail.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    for w in WORKLOADS:
        assert set(res[w]["arms"]) == set(ARMS)
        for arm in res[w]["arms"].values():
            assert arm["violations"] == 0 and arm["train_s"] > 0
            assert arm["decode_tokens_per_step"] > 0 and 0.0 <= arm["zero_adv_fraction"] <= 1.0
        for key in ("skip_train_time_ratio", "zero_adv_step_time_ratio"):
            assert math.isfinite(res[w][key]) and res[w][key] > 0
    assert res["skip_train_time_ratio"] == res["longtail"]["skip_train_time_ratio"]
