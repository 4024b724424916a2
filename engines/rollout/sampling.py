"""The `hf` backend's sampling math, as pure tensor functions: the distribution a token is
drawn from (and whose log_softmax is the stored behaviour logprob), the seeded draw that
lets finished rows leave the batch without changing any live row's sample, and left
padding. `engines.rollout.hf_backend` runs the loop around them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def processed_logits(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """logits / T with everything outside the top-p nucleus at −inf: the sampling
    distribution, whose log_softmax is the stored behaviour logprob. (R, V) → (R, V)."""
    scaled = logits / temperature  # (R, V)
    if top_p >= 1.0:
        return scaled
    probs = torch.softmax(scaled, dim=-1)
    sorted_p, idx = probs.sort(dim=-1, descending=True)  # (R, V)
    drop_sorted = (sorted_p.cumsum(-1) - sorted_p) > top_p  # keep the smallest set reaching top_p
    drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))


def draw_rows(probs: Tensor, rows: Tensor | None, n: int, gen: torch.Generator | None) -> Tensor:
    """One sample per row of the whole batch, from `probs` (A, V) of the rows still in it
    (`rows`: their indices among the n; None: all n are) → (n, 1) ids, 0 for the rest.

    Every one of the n rows draws, the rows that left with a certain token: multinomial's
    draws from the generator depend on the tensor's shape, not its values (one uniform per
    row on the CPU: `test_hf_finished_rows_leave_the_batch_and_change_no_sample`), so the
    seeded stream — and with it every live row's sample — is the one a batch that keeps
    all its rows would draw. On a GPU this rests on the same property of torch's kernel,
    which no test here can run."""
    if rows is None:
        return torch.multinomial(probs, 1, generator=gen)  # (n, 1)
    full = probs.new_zeros((n, probs.shape[-1]))  # (n, V)
    full[:, 0] = 1.0
    full[rows] = probs
    return torch.multinomial(full, 1, generator=gen)  # (n, 1)


def leave(done: Tensor, rows: Tensor | None, n: int) -> tuple[Tensor | None, Tensor | None]:
    """The rows that stay once the `done` ones leave: (their indices among the n, or None
    while all n stay; the positions to keep in the current batch, or None when none leaves)."""
    current = rows if rows is not None else torch.arange(n, device=done.device)  # (A,)
    keep = (~done[current]).nonzero().flatten()  # (A',)
    if len(keep) == len(current):
        return rows, None
    return current[keep], keep


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """rows → input_ids (R, L) left-padded with pad_id, attention_mask (R, L) of 0/1."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, mask
