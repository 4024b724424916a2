"""The rollout-engine benchmark's --small run: its keys and what holds whatever the timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.rollout_engines import SAMPLES, main, parameters

pytestmark = pytest.mark.slow


def test_rollout_engines_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "rollout_engines.json"
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


def test_rollout_engines_bench_measures_a_given_model(tmp_path: Path) -> None:
    """`--model DIR`: the user's own model instead of the random sizes (here a GPT-2-style
    one, whose config names its sizes `n_layer`/`n_head`/`n_embd`), named by its directory,
    with the per-token ratio that compares engines whose samples end at other lengths."""
    from workloads.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "my-gpt2", family="gpt2")
    res = main(["--small", "--model", str(model), "--json", str(tmp_path / "b.json")])
    assert list(res["sizes"]) == ["my-gpt2"]
    assert "hf_over_vllm_toy" not in res  # no toy model was measured
    (row,) = res["sizes"]["my-gpt2"]["batches"]
    g, t = row["generate_s"], row["tokens"]
    per_token = (g["hf"] / t["hf"]) / (g["vllm"] / t["vllm"])
    assert row["hf_over_vllm_per_token"] == pytest.approx(per_token, rel=0.01)
    assert res["hf_over_vllm_largest"] == row["hf_over_vllm"]


def test_rollout_engines_bench_refuses_a_directory_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--model .*: no config\.json there"):
        main(["--small", "--model", str(tmp_path), "--json", str(tmp_path / "b.json")])
