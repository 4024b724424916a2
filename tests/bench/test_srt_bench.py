"""A small run of the speculative-rollout engine benchmark: its keys, that what SRT stores
is the policy's own distribution, and that drafts save forward passes (counts, never
timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.srt import ARMS, main

pytestmark = pytest.mark.slow


def test_srt_bench_small(tmp_path: Path, longtail_model: str) -> None:
    """On the session's 20-step long-tail model: what `--small` builds."""
    out = tmp_path / "srt.json"
    res = main(["--small", "--model", longtail_model, "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert set(res["arms"]) == set(ARMS)
    for key in ("srt_engine_time_ratio", "srt_cold_time_ratio", "srt_no_compaction_time_ratio"):
        assert res[key] > 0
    assert res["srt_logprob_gap"] < 1e-4  # every stored logprob is the model's own
    # plain decoding makes one pass per token of the longest response; drafts accepted
    # from the prompt's earlier rollouts and its siblings make SRT need fewer (seeded
    # sampling, 20-step warm start: 68 of 96 passes here)
    assert res["arms"]["srt"]["passes"] < res["arms"]["plain"]["passes"]
    assert res["srt_passes_ratio"] < 1.0
