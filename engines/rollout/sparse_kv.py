"""Sparse-KV rollouts (Sparse-RL): decoding with a bounded KV cache per sequence.

A dense decode keeps every token's keys and values, so a sequence's cache grows with its
length and bounds how many sequences a rollout engine holds at once (the "memory wall").
Here each layer keeps at most `SparseKV.budget` entries per sequence and KV head: once the
cache has grown `every` entries past the budget it is cut back to it, keeping

- the first `sinks` entries (attention sinks, StreamingLLM: the first tokens draw attention
  whatever they say, and dropping them derails the softmax);
- the last `window` entries (the recent tokens: R-KV's and SnapKV's local window);
- of the rest, the entries the last `window` queries attended most, summed over the query
  heads of each KV head (SnapKV's observation window: what the recent queries look at is what
  the next ones will).

Each layer and KV head chooses on its own, as SnapKV and R-KV do. Kept entries carry the
rotary position they were computed at, and new tokens keep their true positions, so what is
dropped is information, never order.

The sampled tokens and their stored logprobs are this sparse sampler's, π_sparse: they are
what the engine drew them from, so the store's behaviour logprobs stay exact. The trainer
recomputes the dense π_old and corrects for the gap (`engines.training.losses`, the
`sparse_rl` anchor). With a budget no sequence reaches, this is the dense decode.

Prompts are batched by length (every row of a batch shares its cache length, so no padding
and no per-head attention mask is needed after a cut). The attention weights come from the
model's eager attention, switched on for the call: the prompt pass materialises its (L, L)
attention per layer, so this is for the short prompts of RL rollouts, not long contexts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.rollout.base import BadRequestError, Completion, SamplingParams, SparseKV, budget
from engines.rollout.sampling import draw_rows, processed_logits, repeat_rows


@dataclass(frozen=True, slots=True)
class SparseResult:
    """What a sparse-KV call returns: the completions, [prompt][sample], and the KV cache
    bytes the engine held for each sequence at its batch's peak, in the same order,
    flattened (prompt-major). A finished row stays in its batch until the batch ends (this
    loop does not compact), so that is its batch's largest cache, per row."""

    completions: list[list[Completion]]
    kv_bytes: list[int]


def keep_indices(scores: Tensor, kv: SparseKV) -> Tensor:
    """The cache entries kept, ascending: (R, H, L) scores → (R, H, budget) indices, for a
    cache of L > budget entries. The sinks and the window are kept whatever their score; the
    middle's best `budget − sinks − window` by score fill the rest (a tie keeps the earlier
    entry)."""
    rows, heads, length = scores.shape
    dev = scores.device
    fixed = torch.cat(
        [torch.arange(kv.sinks, device=dev), torch.arange(length - kv.window, length, device=dev)]
    ).expand(rows, heads, -1)  # (R, H, sinks + window)
    middle = scores[..., kv.sinks : length - kv.window]  # (R, H, M)
    k = kv.budget - kv.sinks - kv.window
    order = middle.sort(dim=-1, descending=True, stable=True).indices[..., :k]  # (R, H, k)
    return torch.cat([fixed, order + kv.sinks], dim=-1).sort(dim=-1).values


def grouped(attn: Tensor, kv_heads: int) -> Tensor:
    """(R, Hq, Q, L) attention of the query heads → (R, Hkv, Q, L), summed over the query
    heads that share a KV head (GQA): the entry is kept or dropped for all of them."""
    rows, q_heads, queries, length = attn.shape
    return attn.view(rows, kv_heads, q_heads // kv_heads, queries, length).sum(2)


def observe(obs: Tensor | None, attn: Tensor, window: int) -> Tensor:
    """The last `window` queries' attention (R, H, ≤window, L): the earlier rows `obs`
    (zero on the entries added since, which they could not see) and the new ones `attn`."""
    if obs is not None:
        obs = F.pad(obs, (0, attn.shape[-1] - obs.shape[-1]))
        attn = torch.cat([obs, attn], dim=-2)
    return attn[..., -window:, :]


def compress(layer: Any, obs: Tensor, kv: SparseKV) -> Tensor:
    """Cut one layer's cache (`layer.keys`, `layer.values`: (R, H, L, D)) back to the
    budget, in place; returns its observation rows on the kept entries."""
    keep = keep_indices(obs.sum(-2), kv)  # (R, H, B)
    idx = keep[..., None].expand(-1, -1, -1, layer.keys.shape[-1])  # (R, H, B, D)
    layer.keys = layer.keys.gather(2, idx)
    layer.values = layer.values.gather(2, idx)
    return obs.gather(-1, keep[:, :, None, :].expand(-1, -1, obs.shape[-2], -1))


def entry_bytes(past: Any) -> int:
    """Bytes one cache entry (a token's keys and values, every layer and KV head) takes."""
    return sum(2 * int(x.keys[0, :, :1].numel()) * x.keys.element_size() for x in past.layers)


@contextmanager
def eager(model: Any) -> Iterator[None]:
    """The model's eager attention for the block (the others return no weights)."""
    was = model.config._attn_implementation
    if was != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if was != "eager":
            model.set_attn_implementation(was)


def _layers(past: Any) -> list[Any]:
    layers = list(past.layers)
    if any(type(x).__name__ != "DynamicLayer" for x in layers):
        raise BadRequestError("a sparse-KV rollout needs a full-attention cache on every layer")
    return layers


def _batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    width: int,
    stop: set[int],
    gen: torch.Generator | None,
) -> tuple[list[Completion], list[int]]:
    """One batch of equal-length prompts, n rows each: the decode loop of `hf_backend`,
    with the cache cut back to the budget after each forward pass that outgrew it."""
    kv = params.sparse_kv
    assert kv is not None
    dev = next(model.parameters()).device
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=dev)  # (P, L)
    out = model(input_ids=ids, use_cache=True, output_attentions=True, logits_to_keep=1)
    past, logits = out.past_key_values, out.logits[:, -1].float()  # (P, V)
    heads = [x.keys.shape[1] for x in _layers(past)]
    obs = [
        observe(None, grouped(a, h), kv.window) for a, h in zip(out.attentions, heads, strict=True)
    ]
    (logits,) = repeat_rows(params.n, past, logits)  # (R, V)
    obs = [o.repeat_interleave(params.n, dim=0) for o in obs]
    rows = logits.shape[0]
    sizes = [past.get_seq_length()]  # entries held after each forward pass
    obs = _cut(past, obs, kv)
    next_pos = torch.full((rows, 1), ids.shape[1], dtype=torch.long, device=dev)
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=dev)  # (S,)
    toks: list[Tensor] = []
    lps: list[Tensor] = []
    length = torch.zeros(rows, dtype=torch.long, device=dev)
    stopped = torch.zeros(rows, dtype=torch.bool, device=dev)
    done = torch.zeros(rows, dtype=torch.bool, device=dev)
    for _ in range(width):
        probs = torch.softmax(processed_logits(logits, params.temperature, params.top_p), -1)
        tok = draw_rows(probs, None, rows, gen)  # (R, 1)
        toks.append(tok[:, 0])
        lps.append(probs.gather(-1, tok)[:, 0].log())
        live = ~done
        length += live
        ends = live & (tok == stop_ids).any(-1)
        stopped |= ends
        done |= ends | (length >= width)
        if bool(done.all()):
            break
        held = past.get_seq_length()
        out = model(
            input_ids=tok,
            attention_mask=torch.ones((rows, held + 1), dtype=torch.long, device=dev),
            position_ids=next_pos,
            past_key_values=past,
            use_cache=True,
            output_attentions=True,
        )
        logits = out.logits[:, -1].float()
        attns = zip(obs, out.attentions, heads, strict=True)
        obs = [observe(o, grouped(a, h), kv.window) for o, a, h in attns]
        sizes.append(past.get_seq_length())
        obs = _cut(past, obs, kv)
        next_pos = next_pos + 1
    sampled, logprobs = torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist()
    kept, ended = length.tolist(), stopped.tolist()
    per_entry = entry_bytes(past)
    comps = [
        Completion(
            tuple(sampled[r][: kept[r]]),
            tuple(logprobs[r][: kept[r]]),
            "stop" if ended[r] else "length",
        )
        for r in range(rows)
    ]
    return comps, [max(sizes) * per_entry] * rows


def _cut(past: Any, obs: list[Tensor], kv: SparseKV) -> list[Tensor]:
    """Every layer cut back to the budget once it holds `every` entries past it."""
    if past.get_seq_length() < kv.budget + kv.every:
        return obs
    return [compress(layer, o, kv) for layer, o in zip(_layers(past), obs, strict=True)]


@torch.no_grad()
def sparse_sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    context: int,
    stop: set[int],
) -> SparseResult:
    """Sample `params.n` completions of each prompt under `params.sparse_kv`; prompts of one
    length share a batch, batches run in order of length, drawing from one seeded stream."""
    gen = None
    if params.seed is not None:
        dev = next(model.parameters()).device
        gen = torch.Generator(device=dev).manual_seed(params.seed)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    comps: dict[int, list[Completion]] = {}
    sizes: dict[int, list[int]] = {}
    with eager(model):
        for n_tokens in sorted(by_length):
            members = by_length[n_tokens]
            width = budget(n_tokens, params, context)
            got, held = _batch(model, [prompts[i] for i in members], params, width, stop, gen)
            for j, i in enumerate(members):
                comps[i] = got[j * params.n : (j + 1) * params.n]
                sizes[i] = held[j * params.n : (j + 1) * params.n]
    order = range(len(prompts))
    return SparseResult([comps[i] for i in order], [b for i in order for b in sizes[i]])
