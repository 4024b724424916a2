"""The `hf` backend's sampling math, as pure tensor functions: the distribution a token is
drawn from (and whose log_softmax is the stored behaviour logprob), the seeded
inverse-CDF draw (which also lets finished rows leave the batch without changing any live
row's sample), and left padding. `engines.rollout.hf_backend` runs the loop around them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def processed_logits(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """logits / T with everything outside the top-p nucleus at −inf: the sampling
    distribution, whose log_softmax is the stored behaviour logprob. (R, V) → (R, V)."""
    scaled = logits if temperature == 1.0 else logits / temperature  # (R, V)
    if top_p >= 1.0:
        return scaled
    probs = torch.softmax(scaled, dim=-1)
    sorted_p, idx = probs.sort(dim=-1, descending=True)  # (R, V)
    drop_sorted = (sorted_p.cumsum(-1) - sorted_p) > top_p  # keep the smallest set reaching top_p
    drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))


def uniforms(n: int, gen: torch.Generator | None, device: torch.device) -> Tensor:
    """n uniforms in [0, 1) from the seeded stream, in float64 (n,): one per row and draw."""
    return torch.rand(n, generator=gen, device=device, dtype=torch.float64)


def draw(probs: Tensor, u: Tensor) -> Tensor:
    """One id per row of `probs` (R, V) — non-negative, each row with some mass, not
    necessarily normalized — by inverting its CDF at the uniforms `u` (R,) → (R,).

    Why not `torch.multinomial`: for one sample it draws an exponential per vocabulary
    entry (the Gumbel-max trick), 33% of a decode step at a 16,000-token vocabulary on one
    CPU thread; this takes one uniform per row and a cumulative sum (`bench.rollout_engines`).
    The target `total·(1 − u)` lies in (0, total], so the first index whose CDF reaches it
    has positive probability: a top-p-masked entry (exactly 0) is never drawn. On the CPU,
    torch's float32 cumsum accumulates in float64, so the CDF is exact to float32's
    rounding of each entry."""
    cdf = probs.cumsum(-1)  # (R, V)
    target = cdf[:, -1:].double() * (1.0 - u[:, None])  # (R, 1) in (0, total]
    ids = torch.searchsorted(cdf, target.to(cdf.dtype))[:, 0]  # (R,)
    return ids.clamp_(max=probs.shape[-1] - 1)  # only a NaN row could run past the end


def draw_rows(probs: Tensor, rows: Tensor | None, n: int, gen: torch.Generator | None) -> Tensor:
    """One sample per row of the whole batch, from `probs` (A, V) of the rows still in it
    (`rows`: their indices among the n; None: all n are) → (n, 1) ids, 0 for the rest.

    All n rows take their uniform from the seeded stream, whether they are still in the
    batch or not, so the stream — and with it every live row's sample — is the one a
    batch that keeps all its rows would draw
    (`test_hf_finished_rows_leave_the_batch_and_change_no_sample`)."""
    u = uniforms(n, gen, probs.device)  # (n,)
    if rows is None:
        return draw(probs, u)[:, None]  # (n, 1)
    ids = torch.zeros(n, dtype=torch.long, device=probs.device)  # (n,)
    ids[rows] = draw(probs, u[rows])
    return ids[:, None]


def leave(done: Tensor, rows: Tensor | None, n: int) -> tuple[Tensor | None, Tensor | None]:
    """The rows that stay once the `done` ones leave: (their indices among the n, or None
    while all n stay; the positions to keep in the current batch, or None when none leaves)."""
    current = rows if rows is not None else torch.arange(n, device=done.device)  # (A,)
    keep = (~done[current]).nonzero().flatten()  # (A',)
    if len(keep) == len(current):
        return rows, None
    return current[keep], keep


def repeat_rows(per: int, past: Any, *tensors: Tensor) -> tuple[Tensor, ...]:
    """After a prompt pass over P prompts: their cache (`past`, in place) and `tensors`
    (P, ...) repeated `per` times each, a prompt's copies together → (P·per, ...). The
    prompt's n samples share one prefill instead of computing it n times."""
    if per == 1:
        return tensors
    past.batch_repeat_interleave(per)
    return tuple(t.repeat_interleave(per, dim=0) for t in tensors)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """rows → input_ids (R, L) left-padded with pad_id, attention_mask (R, L) of 0/1."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, mask
