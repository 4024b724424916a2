"""Tiny models of real families: each family's quirk is really in the saved checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from workloads.family_configs import FAMILIES, Sizes, build_config, family_names, get_family
from workloads.tiny_model import build_tiny_model, load_tokenizer

QWEN_VOCAB = 151936
# (family, model vocabulary) of the default build: qwen2/qwen3 carry the real Qwen size
DEFAULT_VOCAB = {"llama": 512, "qwen2": QWEN_VOCAB, "qwen3": QWEN_VOCAB, "gpt2": 512, "gemma": 512}
TEXT = "Q: 12 + 7 * 3 = ?\nA: step plan 33\nAnswer: 33\nverdict: correct yes"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every family built twice with the same seed (one layer: seconds, even at 151936 rows)."""
    root = tmp_path_factory.mktemp("families")
    return {
        f: (
            build_tiny_model(root / f / "a", family=f, layers=1),
            build_tiny_model(root / f / "b", family=f, layers=1),
        )
        for f in FAMILIES
    }


def _load(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path))


def _file_keys(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as st:
        return set(st.keys())


def test_registry_and_unknown_family(tmp_path: Path) -> None:
    assert family_names() == ("gemma", "gpt2", "llama", "qwen2", "qwen3")
    assert {f: get_family(f).default_vocab for f in FAMILIES} == DEFAULT_VOCAB
    with pytest.raises(
        ValueError, match=r"unknown model family 'mistral'; known: gemma, gpt2, llama, qwen2, qwen3"
    ):
        get_family("mistral")
    with pytest.raises(ValueError, match="unknown model family"):
        build_tiny_model(tmp_path / "m", family="mistral")
    assert not (tmp_path / "m").exists()  # rejected before anything is written
    sizes = Sizes(1, 128, 2, 256, 512, 64, bos=1, eos=2, pad=0)
    assert build_config("gpt2", sizes).n_positions == 64


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_seed_same_bytes_and_family_recorded(
    family: str, built: dict[str, tuple[Path, Path]]
) -> None:
    a, b = built[family]
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    meta = json.loads((a / "flexmarl_tiny.json").read_text())
    assert (meta["family"], meta["vocab"]) == (family, DEFAULT_VOCAB[family])
    cfg = json.loads((a / "config.json").read_text())
    assert (cfg["architectures"], cfg["vocab_size"]) == (
        [get_family(family).architecture],
        DEFAULT_VOCAB[family],
    )


def test_llama_default_is_byte_identical_to_the_original_build(tmp_path: Path) -> None:
    # the warm-started default model and existing runs depend on these exact bytes
    d = build_tiny_model(tmp_path / "m")
    digest = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    assert digest == "03adb8a4a0d98e636360ef5fd299bb9c35e28fc909988426ace8ad6512d6bec2"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tied_checkpoints_store_the_embedding_once(
    family: str, built: dict[str, tuple[Path, Path]]
) -> None:
    path = built[family][0]
    model = _load(path)
    tied = get_family(family).tied
    assert model.config.tie_word_embeddings is tied
    head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert (head is emb) is tied
    assert (head.data_ptr() == emb.data_ptr()) is tied
    assert head.shape[0] == emb.shape[0] == DEFAULT_VOCAB[family]

    keys = _file_keys(path)
    params = {n for n, _ in model.named_parameters()}  # the alias appears once
    state = set(model.state_dict())  # the alias appears under both names
    assert keys == params  # transformers 5.x writes exactly the named parameters
    emb_key = "transformer.wte.weight" if family == "gpt2" else "model.embed_tokens.weight"
    assert emb_key in keys
    if tied:
        assert "lm_head.weight" not in keys
        assert state - keys == {"lm_head.weight"}
    else:
        assert "lm_head.weight" in keys
        assert state == keys


def test_family_quirks_are_in_the_model(built: dict[str, tuple[Path, Path]]) -> None:
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    qwen2 = _load(built["qwen2"][0]).model.layers[0].self_attn
    assert all(getattr(qwen2, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
    assert qwen2.o_proj.bias is None

    qwen3 = _load(built["qwen3"][0])
    attn = qwen3.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (64,)  # per head
    assert qwen3.config.head_dim == 64 and attn.q_proj.bias is None

    gpt2 = _load(built["gpt2"][0])
    block = gpt2.transformer.h[0]
    assert isinstance(block.attn.c_attn, Conv1D)  # fused q/k/v, weight stored (in, out)
    assert block.attn.c_attn.weight.shape == (128, 3 * 128)
    drops = [gpt2.transformer.drop, block.attn.attn_dropout, block.attn.resid_dropout]
    assert all(isinstance(d, nn.Dropout) and d.p == 0.1 for d in drops)
    assert gpt2.transformer.wpe.weight.shape == (512, 128)  # learned positions
    assert not gpt2.training  # from_pretrained returns eval mode: dropout off until train()

    gemma = _load(built["gemma"][0])
    assert gemma.config.head_dim == 64 and gemma.config.hidden_act == "gelu_pytorch_tanh"

    llama = _load(built["llama"][0]).model.layers[0].self_attn
    assert llama.q_proj.bias is None and not hasattr(llama, "q_norm")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tokenizer_loads_and_fits_the_model(
    family: str, built: dict[str, tuple[Path, Path]]
) -> None:
    path = built[family][0]
    tok = load_tokenizer(path)
    assert len(tok) <= DEFAULT_VOCAB[family]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert tok.decode(tok(TEXT).input_ids) == TEXT


def test_qwen2_autotokenizer_replaces_the_saved_tokenizer(
    built: dict[str, tuple[Path, Path]],
) -> None:
    """transformers 5.x forces `Qwen2Tokenizer` for model_type qwen2 whatever
    tokenizer_config.json says: Qwen's pre-tokenizer (single digits) over our BPE merges,
    plus `<|endoftext|>` appended as id 512. Other families keep the saved tokenizer."""
    from tokenizers import Tokenizer

    for family in FAMILIES:
        path = built[family][0]
        tok = load_tokenizer(path)
        raw = Tokenizer.from_file(str(path / "tokenizer.json"))
        same = tok("Q: 12 + 7").input_ids == raw.encode("Q: 12 + 7").ids
        assert same is (family != "qwen2"), family
        assert len(tok) == (513 if family == "qwen2" else 512), family


def test_vocab_override_and_small_vocab_tokenizer(tmp_path: Path) -> None:
    d = build_tiny_model(tmp_path / "q", family="qwen3", layers=1, vocab=300)
    assert json.loads((d / "config.json").read_text())["vocab_size"] == 300
    assert len(load_tokenizer(d)) == 300  # tokenizer trained to the model vocab when smaller


def test_cli_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main

    out = tmp_path / "g"
    assert main(["tiny-model", str(out), "--family", "gpt2", "--layers", "1"]) == 0
    assert str(out) in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["n_layer"], cfg["vocab_size"]) == ("gpt2", 1, 512)
    assert json.loads((out / "flexmarl_tiny.json").read_text())["family"] == "gpt2"
    with pytest.raises(SystemExit) as exc:
        main(["tiny-model", str(tmp_path / "x"), "--family", "mistral"])
    assert exc.value.code == 2
    assert "invalid choice: 'mistral'" in capsys.readouterr().err
