"""Padding-free training: a micro-batch's backbone run in groups of rows of similar length,
each group cut to its own longest row, instead of the whole micro-batch padded to its
longest (`optim.packing: by_length`, the default; `none` is the padded path).

Why: on heavy-tailed response lengths (the longtail workload: p50 4, p99 42 tokens) a
micro-batch padded to its longest row is mostly padding, and the backbone's cost is
linear in the padded tokens. The lm_head already runs on the response tokens only
(`batch.token_logprobs`), so the backbone is where the padding is paid.

Why exact: a causal LM's hidden state at a real token depends only on the tokens before it
in its own row; right padding comes after every real token, so cutting it off changes no
real token's value (up to float summation order inside the kernels). The log-probabilities
are put back at their places in the micro-batch's (b,T) layout, and the loss, its
normalisation (`aggregate`: token-mean, sequence-mean, the step's global counts), the KL
term, EchoRL's term and every metric are then computed by the same code, over the same
tensors, as on the padded path. Rows with no response token are left out of the backbone:
nothing they compute reaches the loss. A LoRA adapter's dropout (off by default) draws its
masks over the tensors it sees, so with dropout on the masks differ from the padded path's
(which depend on the padding width anyway); the distribution is the same.

Why groups and not one packed sequence: transformers 5 does pack rows end to end with
their own position ids (its mask builder reads a drop in the position ids as a new sequence
and masks attention across it), but with the CPU kernels here (sdpa, eager) that mask is a
dense block-diagonal one, and measured on the longtail micro-batches (2026-12-07, one core,
15 interleaved repeats of forward + backward) rows packed into sequences as wide as the
longest row were 1.65× the padded path and length groups 1.77×, for a path that also
depends on every family's mask builder honouring position ids. Groups keep every kernel
and every family's own code path; the one thing they add is a backbone pass per group,
which `length_groups` weighs against the padding it saves (`GROUP_COST_TOKENS`). The input
embeddings are looked up once for the whole micro-batch and the lm_head runs once over
every group's response positions, so a group costs the backbone's per-call overhead only
(the dense embedding-gradient pass, vocabulary × hidden per call, is paid once). Groups
run without an attention mask where every row is right-padded (`is_prefix_mask`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from engines.training.batch import (
    _positions,
    backbone_and_head,
    check_logprob_args,
    head_logprobs,
    token_logprobs,
)

PACKINGS = ("none", "by_length")
# One backbone pass's fixed cost, in padded tokens: the forward + backward of a 2-layer
# hidden-128 model (the workloads' tiny model) costs a few ms a call beyond ≈ 0.05–0.08 ms a
# token on one core of the development machine; 64 and 128 measured alike on the longtail
# micro-batches, and bigger models have a smaller fixed share (fewer tokens' worth).
GROUP_COST_TOKENS = 64


def check_packing(name: str) -> str:
    """`name` if it is a known packing, else a ValueError listing them."""
    if name not in PACKINGS:
        raise ValueError(f"packing {name!r} unknown; known: {', '.join(PACKINGS)}")
    return name


def scored_lengths(response_mask: Tensor) -> list[int]:
    """Per row, the columns its scoring needs: up to its last response token (0: none).
    (b,T) → b ints. Right padding and anything after the response are never needed."""
    has = response_mask != 0  # (b,T)
    cols = torch.arange(1, has.shape[1] + 1, device=has.device)  # (T,)
    return [int(v) for v in (has * cols).amax(dim=1).tolist()] if has.numel() else []


def length_groups(
    lengths: Sequence[int], group_cost: int = GROUP_COST_TOKENS
) -> tuple[tuple[int, ...], ...]:
    """Row indices in groups of similar length, each group to be padded to its longest.

    Rows of length 0 are left out. The others, sorted by length (ties by index, so the
    result is a function of the lengths alone: a replayed micro-batch is grouped the same),
    are cut into contiguous runs minimising Σ_g (group_cost + rows_g × longest_g): the
    padded tokens the groups compute plus a fixed cost per backbone pass. Exact dynamic
    programming over the cut points, O(n²) on numpy for n rows."""
    if group_cost < 0:
        raise ValueError(f"group_cost must be >= 0, got {group_cost}")
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (lengths[i], i))
    n = len(order)
    if n == 0:
        return ()
    ls = np.array([lengths[i] for i in order], dtype=np.float64)
    best = np.zeros(n + 1)  # best[j]: cost of the first j sorted rows
    cut = np.zeros(n + 1, dtype=np.int64)  # cut[j]: where the last group of those j starts
    for j in range(1, n + 1):
        starts = np.arange(j)
        costs = best[:j] + group_cost + (j - starts) * ls[j - 1]
        cut[j] = int(np.argmin(costs))  # the first minimum: the fewest groups on a tie
        best[j] = costs[cut[j]]
    bounds = []
    j = n
    while j > 0:
        bounds.append((int(cut[j]), j))
        j = int(cut[j])
    return tuple(tuple(order[a:b]) for a, b in reversed(bounds))


def is_prefix_mask(attention_mask: Tensor) -> bool:
    """Every row's real tokens are a prefix (right padding, `build_microbatch`'s layout).
    Then under causal attention no real token sees a padding token, so the mask changes no
    value that is scored: the groups run without it, on the kernels' causal fast path."""
    cols = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    prefix = cols < attention_mask.sum(dim=1, keepdim=True)  # (b,T)
    return bool(torch.equal(prefix, attention_mask != 0))


def padding_share(lengths: Sequence[int], groups: Sequence[Sequence[int]]) -> float:
    """Share of the token slots that `groups` compute (each padded to its longest row)
    that are padding; one group of every row is the padded path's share."""
    slots = sum(len(g) * max(lengths[i] for i in g) for g in groups if g)
    real = sum(lengths[i] for g in groups for i in g)
    return 0.0 if slots == 0 else 1.0 - real / slots


def _backbone_parts(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module] | None:
    """(backbone, its input embedding, lm_head) of an HF causal LM, or None for any other
    model (which is then run padded)."""
    parts = backbone_and_head(model)
    get_embed = None if parts is None else getattr(parts[0], "get_input_embeddings", None)
    embed = get_embed() if callable(get_embed) else None
    if parts is None or not isinstance(embed, torch.nn.Module):
        return None
    return parts[0], embed, parts[1]


def grouped_token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    group_cost: int = GROUP_COST_TOKENS,
) -> Tensor:
    """`token_logprobs` with the backbone run per `length_groups` group: the same (b,T)
    float32 result at the same places, 0 off the response, differentiable.

    Falls back to `token_logprobs` where every position is scored (`response_mask` None)
    or the model is not an HF causal LM with a separate backbone and head."""
    parts = _backbone_parts(model)
    if parts is None or response_mask is None:
        return token_logprobs(
            model,
            input_ids,
            attention_mask,
            response_mask,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
        )
    decoder, embed, head = parts
    check_logprob_args(temperature, chunk_tokens)
    _positions(input_ids, response_mask)  # the padded path's shape and column-0 checks
    lengths = scored_lengths(response_mask)
    groups = length_groups(lengths, group_cost)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if not groups:  # nothing to score: still usable in `(logp * mask).sum().backward()`
        return out.requires_grad_(torch.is_grad_enabled())
    embeds = embed(input_ids)  # (b,T,H) once: one embedding-gradient pass for all groups
    prefix = is_prefix_mask(attention_mask)
    hs, targets, rows, cols = [], [], [], []
    for group in groups:
        idx = torch.tensor(group, dtype=torch.long, device=input_ids.device)  # (b_g,)
        width = max(lengths[i] for i in group)
        ids_g = input_ids[idx, :width]  # (b_g,L_g)
        r, c = _positions(ids_g, response_mask[idx, :width])
        mask = None if prefix else attention_mask[idx, :width]
        out_g = decoder(inputs_embeds=embeds[idx, :width], attention_mask=mask, use_cache=False)
        hidden = out_g[0]  # (b_g,L_g,H)
        hs.append(hidden[r, c - 1])  # position t-1 predicts token t
        targets.append(ids_g[r, c])
        rows.append(idx[r])
        cols.append(c)
    picked = head_logprobs(
        model, head, torch.cat(hs), torch.cat(targets), temperature, chunk_tokens
    )  # (N,)
    return out.index_put((torch.cat(rows), torch.cat(cols)), picked)


LogprobFn = Callable[..., Tensor]
_BY_PACKING: dict[str, LogprobFn] = {
    "none": token_logprobs,
    "by_length": grouped_token_logprobs,
}


def policy_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor | None,
    *,
    temperature: float,
    packing: str,
) -> Tensor:
    """log πθ of the response tokens (b,T) the way `packing` computes them (the trainer's
    one entry point: the gradient pass and the KL reference use the same)."""
    fn = _BY_PACKING[check_packing(packing)]
    return fn(model, input_ids, attention_mask, response_mask, temperature=temperature)
