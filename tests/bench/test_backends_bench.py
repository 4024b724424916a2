"""The backend benchmark's --small run: its keys and what holds whatever the timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.backends import SAMPLES, main, parameters

pytestmark = pytest.mark.slow


def test_backends_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "backends.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert list(res["sizes"]) == ["toy"]
    toy = res["sizes"]["toy"]
    (row,) = toy["batches"]
    assert row["completions"] == 4 * SAMPLES and row["max_tokens"] == 32
    g = row["generate_s"]
    assert g["hf"] > 0 and g["vllm"] > 0
    assert row["hf_over_vllm"] == pytest.approx(g["hf"] / g["vllm"], abs=2e-3)
    assert res["hf_over_vllm_toy"] == res["hf_over_vllm_largest"] == row["hf_over_vllm"]
    # a random model rarely ends early: both engines decode (nearly) every token asked for
    for name in ("hf", "vllm"):
        assert 0.9 * 16 * 32 <= row["tokens"][name] <= 16 * 32
    # the toy model is the TRL peer job's: 2 layers, hidden 128, vocabulary 512
    assert 0.3e6 < toy["parameters"] < 1e6


def test_parameters_are_counted_from_the_headers_as_torch_counts_them(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from workloads.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", layers=1, hidden=64, heads=2, intermediate=96)
    loaded = AutoModelForCausalLM.from_pretrained(model)
    assert parameters(model) == sum(p.numel() for p in loaded.parameters())
