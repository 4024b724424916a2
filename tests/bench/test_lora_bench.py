"""A small run of the LoRA benchmark keeps it working (keys and sanity, never timings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.lora import ARMS, main

pytestmark = pytest.mark.slow

RATIOS = (
    "rollout_rss_ratio",
    "train_rss_ratio",
    "publish_time_ratio",
    "swap_time_ratio",
    "step_time_ratio",
)


def test_lora_bench_small_writes_every_ratio(tmp_path: Path, prefect_server: str) -> None:
    out = tmp_path / "lora.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert set(res["arms"]) == set(ARMS) and res["model_parameters"] > 0
    for arm in res["arms"].values():
        assert arm["violations"] == 0 and arm["step_s"] > 0
        assert arm["rollout_rss_mb"] > 0 and arm["train_rss_mb"] > 0
        assert arm["publish_ms"] > 0 and arm["swaps"] > 0  # 5 agents on 2 slots swap
    for key in RATIOS:
        assert math.isfinite(res[key]) and res[key] > 0, key
    # what a swap moves is measured, not timed: an adapter and its moments, not a model
    assert res["arms"]["lora"]["swap_mb"] < res["arms"]["full"]["swap_mb"] / 4
