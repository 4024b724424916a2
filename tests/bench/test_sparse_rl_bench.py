"""A small run of the Sparse-RL benchmark: its keys, that the bounded cache holds less than
the dense one at the same batch, that the stored logprobs are the sparse sampler's (away
from the dense ones, where the dense arm's are float noise), and that a sparse training run
ends with a held-out reward (counts and bounds, never timings or a reward threshold)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sparse_rl import ARMS, main

pytestmark = pytest.mark.slow


def test_sparse_rl_bench_small(tmp_path: Path, longtail_model: str, cluster: str) -> None:
    out = tmp_path / "sparse_rl.json"
    argv = ["--small", "--model", longtail_model, "--json", str(out), "--scheduler", cluster]
    res = main(argv)
    assert json.loads(out.read_text()) == res
    assert set(res["engine_arms"]) == set(res["heldout_reward"]) == set(ARMS)
    assert 0 < res["sparse_kv_bytes_ratio"] < 1
    assert res["dense_logprob_mismatch"] < 1e-5 < res["sparse_logprob_mismatch"]
    assert all(0 <= r <= 1 for rs in res["heldout_reward"].values() for r in rs)
    assert 0 < res["sparse_weight_mean"] <= 1.5
