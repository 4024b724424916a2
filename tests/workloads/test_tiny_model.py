"""The tiny local model: deterministic bytes, loads in transformers and in vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.tiny_model import build_tiny_model, load_tokenizer


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("tiny_build")
    a = build_tiny_model(root / "a", seed=0)
    b = build_tiny_model(root / "b", seed=0)
    c = build_tiny_model(root / "c", seed=1, layers=1, vocab=300)
    return a, b, c


def test_same_seed_same_bytes_other_seed_other_weights(built: tuple[Path, Path, Path]) -> None:
    a, b, c = built
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    cfg = json.loads((c / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["vocab_size"]) == (1, 300)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # head dim safe for vLLM


def test_tokenizer_round_trips_the_task_alphabet(built: tuple[Path, Path, Path]) -> None:
    tok = load_tokenizer(built[0])
    assert len(tok) <= 512
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    text = "Q: 12 + 7 * 3 = ?\nA: step plan 33\nAnswer: 33\nverdict: correct yes"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text)  # merges were learned on the corpus


def test_custom_corpus_and_bad_arguments(tmp_path: Path) -> None:
    d = build_tiny_model(tmp_path / "m", corpus=["hello world\n"] * 50, vocab=280, layers=1)
    assert load_tokenizer(d).decode(load_tokenizer(d)("hello world").input_ids) == "hello world"
    with pytest.raises(ValueError, match="vocab=100 is too small"):
        build_tiny_model(tmp_path / "x", vocab=100)
    with pytest.raises(ValueError, match="divisible by heads"):
        build_tiny_model(tmp_path / "y", hidden=100, heads=3)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nothing")):
        load_tokenizer(tmp_path / "nothing")


def test_loads_and_generates_in_transformers_and_vllm(built: tuple[Path, Path, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = built[0]
    tok = load_tokenizer(path)
    prompt = [tok.bos_token_id, *tok("Q: 1 + 1 = ?\nA:").input_ids]
    model = AutoModelForCausalLM.from_pretrained(str(path))
    out = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, len(prompt) + 5)

    from engines.rollout.base import SamplingParams, make_backend

    vllm = make_backend("vllm", path)  # vLLM's own loader reads the directory
    comp = vllm.generate([prompt], SamplingParams(max_tokens=5, temperature=1e-3, seed=0))
    assert list(comp[0][0].response_ids) == out[0, len(prompt) :].tolist()  # same greedy path
