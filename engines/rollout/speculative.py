"""Speculative rollout (SRT) on the `hf` backend: draft tokens from earlier rollouts of the
same prompt, verified by the policy in one forward pass, the sampled distribution exactly
the policy's.

Why it pays in RL rollouts: a group samples one prompt n times, and prompts recur across
steps, so what a sample is about to write has often been written before by a sibling or an
earlier rollout (a counter listing "12 13 14 ..."). A draft of k tokens costs one forward
pass over k + 1 positions, which on a small model or a CPU costs about as much as one
decode step: every accepted draft token is a decode step saved.

Drafts (`SuffixIndex`): per prompt, the n-grams (lengths `1..match`) of its earlier
completions (the last `history`, kept by the backend across calls) and of its rows growing
in this call; a row's draft continues the most recent occurrence of its own longest
matching suffix. SRT's paper keeps a suffix tree; an n-gram table answers the same question
(the longest earlier match of the current suffix, and what followed it) for the short
suffixes that matter here.

Exactness (`verify`): the draft is a point mass q = δ(d), so speculative sampling's rule
becomes: accept d with probability p(d); at the first rejection sample from p with d
removed (renormalized); after the last accepted draft sample one more token from p. Each
emitted token is then distributed exactly as p given what precedes it (Leviathan et al.
2023, Chen et al. 2023), whatever the drafts; only the number of forward passes changes.
The stored logprob of a token is log p of it, as without drafts.

The batched loop (`speculative_sample`) gives every row the same number of new positions
per pass (the longest draft, plus one); a row's rejected or padding positions stay in the KV
cache as holes that the attention mask hides, and positions count only a row's real tokens,
so every row sees exactly its own sequence.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from engines.rollout.base import Completion, SamplingParams, Speculation
from engines.rollout.sampling import draw, repeat_rows, uniforms


@dataclass(slots=True)
class SuffixIndex:
    """Every n-gram (n = 1..match) of a prompt's sequences → where it ended, latest last."""

    match: int
    seqs: list[list[int]] = field(default_factory=list)
    where: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=dict)

    def add_seq(self, tokens: Sequence[int]) -> int:
        """A new sequence; returns its id (then `extend` it)."""
        self.seqs.append([])
        sid = len(self.seqs) - 1
        self.extend(sid, tokens)
        return sid

    def extend(self, sid: int, tokens: Sequence[int]) -> None:
        seq = self.seqs[sid]
        for t in tokens:
            seq.append(t)
            end = len(seq)
            for n in range(1, min(self.match, end) + 1):
                self.where.setdefault(tuple(seq[end - n : end]), []).append((sid, end))

    def draft(self, sid: int, k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of sequence `sid`'s
        longest suffix (of at most `match` tokens) that has one; [] if none."""
        seq = self.seqs[sid]
        if k <= 0:
            return []
        for n in range(min(self.match, len(seq)), 0, -1):
            for other, end in reversed(self.where.get(tuple(seq[-n:]), ())):
                if other == sid and end == len(seq):
                    continue  # the suffix itself
                follow = self.seqs[other][end : end + k]
                if follow:
                    return follow
        return []


class DraftHistory:
    """The backend's memory of earlier completions, per prompt (least recently used prompts
    forgotten first): what later rollouts of the same prompt draft from."""

    def __init__(self, prompts: int = 1024) -> None:
        self.prompts = prompts
        self._done: OrderedDict[tuple[int, ...], list[tuple[int, ...]]] = OrderedDict()

    def index(self, prompt: Sequence[int], spec: Speculation) -> SuffixIndex:
        """A fresh index over the prompt's kept completions, each after the prompt's last
        `match` tokens (so a row's first tokens match where earlier completions began)."""
        key = tuple(prompt)
        idx = SuffixIndex(spec.match)
        head = list(prompt[-spec.match :])
        for done in self._done.get(key, ()):
            idx.add_seq(head + list(done))
        if key in self._done:
            self._done.move_to_end(key)
        return idx

    def clear(self) -> None:
        self._done.clear()

    def remember(self, prompt: Sequence[int], completion: Sequence[int], keep: int) -> None:
        """Keep `completion` among the last `keep` of `prompt` (none with keep 0)."""
        if keep <= 0:
            return
        key = tuple(prompt)
        kept = self._done.setdefault(key, [])
        kept.append(tuple(completion))
        del kept[:-keep]
        self._done.move_to_end(key)
        while len(self._done) > self.prompts:
            self._done.popitem(last=False)


def verify(
    logp: Tensor, drafts: Tensor, lengths: Tensor, gen: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Speculative sampling against point-mass drafts.

    logp: (R, K+1, V) log-probabilities of the sampling distribution at each new position
    (position j predicts the token after draft j-1; position 0 after the last real token);
    drafts: (R, K) proposed ids (entries past a row's length are ignored); lengths: (R,).
    Returns (accepted (R,) in [0, length], token (R,)): row r emits drafts[r, :accepted]
    then `token`, sampled from p at position `accepted` with the rejected draft removed
    (none removed when every draft was accepted)."""
    r, k1, _ = logp.shape
    probs = logp.exp()  # (R, K+1, V)
    k = k1 - 1
    col = torch.arange(k, device=logp.device)  # (K,)
    p_draft = probs[:, :k].gather(-1, drafts[..., None])[..., 0]  # (R, K)
    u = torch.rand((r, k), generator=gen, device=logp.device)  # (R, K)
    ok = (u < p_draft) & (col < lengths[:, None])  # (R, K)
    accepted = ok.long().cumprod(-1).sum(-1)  # (R,) leading accepts
    rows = torch.arange(r, device=logp.device)
    dist = probs[rows, accepted].clone()  # (R, V) p where the next token is sampled
    rejected = (accepted < lengths).nonzero()[:, 0]  # rows whose draft `accepted` failed
    if len(rejected):  # the rejected draft leaves the residual
        dist[rejected, drafts[rejected, accepted[rejected]]] = 0.0
    empty = dist.sum(-1) <= 0  # p(d) rounded to 1 and still rejected: keep d
    dist[empty] = probs[rows, accepted][empty]
    token = draw(dist, uniforms(r, gen, logp.device))  # (R,)
    return accepted, token


def speculative_sample(
    model: Any,
    ids: Tensor,
    mask: Tensor,
    budgets: list[int],
    params: SamplingParams,
    stop: set[int],
    indexes: list[tuple[SuffixIndex, int]],
    processed: Any,
    compact: bool = True,
) -> tuple[list[Completion], int]:
    """Sample every row (R = len(budgets): each of the left-padded prompts `ids`, `mask`
    (P, L) R / P times, a prompt's rows together) to a stop token or its budget with drafts
    from `indexes` (per row: its prompt's index and its sequence id there). The prompt pass
    runs once per prompt; its cache and last logits are repeated for the prompt's rows.
    Returns the completions and the number of forward passes.
    `processed(logits, T, top_p)` gives the sampling distribution's logits. `compact`:
    finished rows leave the batch (a long-tail batch is mostly finished rows; kept only to
    measure what that is worth)."""
    spec = params.speculate
    assert spec is not None
    dev, pad = ids.device, 0
    gen = torch.Generator(device=dev).manual_seed(params.seed) if params.seed is not None else None
    n = len(budgets)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(  # the prompt's last position only (hf_backend: the logits are the memory)
        input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
    )
    past = out.past_key_values
    logits = out.logits[:, -1:].float()  # (P, 1, V)
    logits, mask, pos = repeat_rows(n // ids.shape[0], past, logits, mask, pos)  # (R, ...)
    logp = torch.log_softmax(processed(logits, params.temperature, params.top_p), -1)
    nxt = draw(logp[:, 0].exp(), uniforms(n, gen, dev))  # (R,)
    next_pos = pos[:, -1] + 1  # (R,) where the pending token goes
    toks: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    ended = [False] * n
    done = [False] * n
    passes = 1

    def emit(r: int, new: list[int], new_lp: list[float]) -> list[int]:
        """Append what row r may keep of `new`; returns it."""
        kept: list[int] = []
        for t, lp in zip(new, new_lp, strict=True):
            if done[r]:
                break
            toks[r].append(t)
            lps[r].append(lp)
            kept.append(t)
            if t in stop:
                ended[r] = done[r] = True
            elif len(toks[r]) >= budgets[r]:
                done[r] = True
        return kept

    first = nxt.tolist()
    first_lp = logp[:, 0].gather(-1, nxt[:, None])[:, 0].tolist()
    for r in range(n):
        index, sid = indexes[r]
        index.extend(sid, emit(r, [first[r]], [first_lp[r]]))
    pending = nxt
    alive = list(range(n))  # the original row of each batch position
    while True:
        if compact:  # finished rows leave the batch (their cache rows too)
            keep = [b for b, r in enumerate(alive) if not done[r]]
            if not keep:
                break
            if len(keep) < len(alive):
                sel = torch.tensor(keep, dtype=torch.long, device=dev)
                past.batch_select_indices(sel)
                mask, next_pos, pending = mask[sel], next_pos[sel], pending[sel]
                alive = [alive[b] for b in keep]
        if all(done[r] for r in alive):
            break
        room = [min(spec.draft, budgets[r] - len(toks[r]) - 1) for r in alive]
        drafts = [
            [] if done[r] else indexes[r][0].draft(indexes[r][1], room[b])
            for b, r in enumerate(alive)
        ]
        b_n, k = len(alive), max(len(d) for d in drafts)
        live = torch.tensor([not done[r] for r in alive], device=dev)  # (B,)
        block = torch.full((b_n, k + 1), pad, dtype=torch.long, device=dev)  # (B, K+1)
        block[:, 0] = pending
        lengths = torch.tensor([len(d) for d in drafts], device=dev)  # (B,)
        for b, d in enumerate(drafts):
            if d:
                block[b, 1 : 1 + len(d)] = torch.tensor(d, device=dev)
        cols = torch.arange(k + 1, device=dev)
        new_mask = ((cols[None, :] <= lengths[:, None]) & live[:, None]).long()  # (B, K+1)
        out = model(
            input_ids=block,
            attention_mask=torch.cat([mask, new_mask], -1),
            position_ids=next_pos[:, None] + cols[None, :],
            past_key_values=past,
            use_cache=True,
        )
        passes += 1
        past = out.past_key_values
        logits = out.logits.float()  # (B, K+1, V)
        logp = torch.log_softmax(processed(logits, params.temperature, params.top_p), -1)
        accepted, token = verify(logp, block[:, 1:], lengths, gen)
        emitted = torch.cat([block[:, 1:], block[:, :1]], -1)  # (B, K+1): drafts, then ...
        emitted[torch.arange(b_n, device=dev), accepted] = token  # ... the sampled token
        lp_all = logp.gather(-1, emitted[..., None])[..., 0].tolist()  # (B, K+1)
        acc, tok = accepted.tolist(), token.tolist()
        for b, r in enumerate(alive):
            if not done[r]:
                new = [*drafts[b][: acc[b]], tok[b]]
                indexes[r][0].extend(indexes[r][1], emit(r, new, lp_all[b][: acc[b] + 1]))
        new_mask[cols[None, :] > accepted[:, None]] = 0  # rejected drafts become holes
        mask = torch.cat([mask, new_mask], -1)
        next_pos = next_pos + 1 + accepted
        pending = token
    comps = [
        Completion(tuple(toks[r]), tuple(lps[r]), "stop" if ended[r] else "length")
        for r in range(n)
    ]
    return comps, passes
