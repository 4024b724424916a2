"""The KV-cache benchmark's --small run: its keys, and that the sized cache holds the whole
call it is timed on; never timings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.kv_cache import MAX_TOKENS, PROMPT_LEN, main
from engines.devices import CPU_KV_CACHE_BYTES
from engines.kv_cache import BLOCK_TOKENS

pytestmark = pytest.mark.slow


def test_kv_cache_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "kv_cache.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert res["kv_cache_bytes"]["fixed"] == CPU_KV_CACHE_BYTES
    blocks = math.ceil((PROMPT_LEN + MAX_TOKENS) / BLOCK_TOKENS)
    assert res["kv_tokens"]["sized"] >= res["rows"] * blocks * BLOCK_TOKENS
    assert res["tokens"]["sized"] == res["tokens"]["fixed"] > 0  # the same seeded samples
    g = res["generate_s"]
    assert res["kv_sized_over_fixed"] == pytest.approx(g["sized"] / g["fixed"], abs=2e-3)
