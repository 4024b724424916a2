"""Test helpers: random ragged micro-batches for the tiny model of conftest.py."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig, Qwen2Config

from engines.training.batch import TrainMicroBatch, build_microbatch

VOCAB = 64


def random_batch(seed: int, n: int, group: int = 4) -> list[TrainMicroBatch]:
    """n samples (whole groups of `group`) with ragged prompts/responses, one mb per sample."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(3, VOCAB, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g)
        r = torch.randint(3, VOCAB, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
        old = (-torch.rand(len(r), generator=g) * 4 - 2).tolist()  # ≈ log(1/64) ± 2
        adv = float(torch.randn(1, generator=g)) + (0.5 if i % group else -0.5)
        out.append(build_microbatch([p.tolist()], [r.tolist()], [old], [adv], pad_id=0))
    return out


def merge(mbs: list[TrainMicroBatch]) -> TrainMicroBatch:
    """Re-pad single-sample micro-batches into one batch (same tokens, same alignment)."""
    t = max(int(m.input_ids.shape[1]) for m in mbs)

    def cat(name: str, pad: float) -> torch.Tensor:
        xs = [getattr(m, name) for m in mbs]
        return torch.cat([torch.nn.functional.pad(x, (0, t - x.shape[1]), value=pad) for x in xs])

    return TrainMicroBatch(
        cat("input_ids", 0),
        cat("attention_mask", 0),
        cat("response_mask", 0.0),
        cat("old_logprobs", 0.0),
        torch.cat([m.advantages for m in mbs]),
    )


def qwen2_tied_config(vocab: int = 2048, **overrides: float) -> PretrainedConfig:
    """A tiny Qwen2: tied embeddings, q/k/v biases, one KV head."""
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        **overrides,
    )
