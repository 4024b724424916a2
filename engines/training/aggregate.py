"""One aggregation function from a per-token loss (B,T) to the scalar that is back-propagated.

Invariance (why the trainer passes *global* counts): let one optimizer step consume a global
batch of B sequences with N_tok response tokens, split into micro-batches of b_j sequences.
Every mode here is a sum over sequences of a per-sequence term divided by a constant that
depends only on the global batch (N_tok or B). So with `global_tokens=N_tok`,
`global_seqs=B`,

    Σ_j aggregate(loss_j, mask_j, mode, global_tokens=N_tok, global_seqs=B)
        == aggregate(loss_full, mask_full, mode)

exactly (up to float summation order), hence gradients accumulated over micro-batches equal
the full-batch gradient: this *is* the b/B weighting of one global batch, without the bias that
a mean-of-micro-batch-means has when micro-batches hold different token counts. The same
holds across data-parallel ranks when the counts are all-reduced first. Without global
counts, each call normalises by its own batch (the right thing for a single full batch).

Modes
-----
- "token-mean":          Σ_{i,t} m·ℓ / N_tok          (TRL "bnpo", DAPO token-level)
- "seq-mean-token-mean": Σ_i (Σ_t m·ℓ / n_i) / B      (TRL "grpo", the DeepSeekMath form)
- "seq-mean-token-sum":  Σ_{i,t} m·ℓ / B              (Dr.GRPO: constant normaliser; TRL's
  "dr_grpo" further divides by the max completion length, a constant = a learning-rate scale)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from meg.registry import Registry

AggregateFn = Callable[[Tensor, Tensor, float, float], Tensor]
AGGREGATIONS: Registry[AggregateFn] = Registry("aggregation mode")


def register_aggregation(name: str) -> Callable[[AggregateFn], AggregateFn]:
    """Decorator: `@register_aggregation("token-mean")`; fn(loss_m, mask, n_tok, n_seq)."""
    return AGGREGATIONS.register(name)


@register_aggregation("token-mean")
def _token_mean(loss_m: Tensor, mask: Tensor, n_tok: float, n_seq: float) -> Tensor:
    return loss_m.sum() / n_tok


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(loss_m: Tensor, mask: Tensor, n_tok: float, n_seq: float) -> Tensor:
    per_seq = loss_m.sum(1) / mask.sum(1).clamp(min=1.0)  # (B,) an empty response counts 0
    return per_seq.sum() / n_seq


@register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(loss_m: Tensor, mask: Tensor, n_tok: float, n_seq: float) -> Tensor:
    return loss_m.sum() / n_seq


def aggregate(
    loss_tok: Tensor,
    mask: Tensor,
    mode: str,
    *,
    global_tokens: int | None = None,
    global_seqs: int | None = None,
) -> Tensor:
    """(B,T) per-token loss, (B,T) 0/1 mask → scalar; see the module docstring for modes.

    Masked positions are zeroed with `where`, so a non-finite loss on padding never leaks.
    """
    if loss_tok.shape != mask.shape or loss_tok.ndim != 2:
        raise ValueError(
            "loss_tok and mask must both be (B,T); got "
            f"{tuple(loss_tok.shape)}, {tuple(mask.shape)}"
        )
    fn = AGGREGATIONS.get(mode)
    m = mask.to(loss_tok.dtype)
    loss_m = torch.where(m > 0, loss_tok, torch.zeros_like(loss_tok))  # (B,T)
    n_tok = float(global_tokens) if global_tokens is not None else max(float(m.sum()), 1.0)
    n_seq = float(global_seqs) if global_seqs is not None else max(float(m.shape[0]), 1.0)
    if n_tok <= 0 or n_seq <= 0:
        raise ValueError(f"global_tokens/global_seqs must be > 0, got {n_tok}/{n_seq}")
    return fn(loss_m, m, n_tok, n_seq)
