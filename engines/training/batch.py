"""The trainer's input: a padded micro-batch of whole sequences (prompt + response).

Alignment convention (one place, used by every consumer): position t of every (b,T) tensor
refers to token `input_ids[:, t]`. `response_mask[i, t] = 1` when that token is a response
token (a token the policy *predicted*); `old_logprobs[i, t]` is the behaviour logprob the
rollout engine recorded for it; `token_logprobs(...)[i, t] = log πθ(input_ids[i,t] | <t)`.
Column 0 is never a response token (every prompt has ≥ 1 token), so the shift needed by a
causal LM happens once, inside `token_logprobs`. Sequences are right-padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True, slots=True)
class TrainMicroBatch:
    """b sequences padded to T. Build with `build_microbatch`."""

    input_ids: Tensor  # (b,T) long
    attention_mask: Tensor  # (b,T) long, 1 on real tokens
    response_mask: Tensor  # (b,T) float, 1 on response tokens
    old_logprobs: Tensor  # (b,T) float, behaviour logprobs, 0 off-response
    advantages: Tensor  # (b,) float
    ref_logprobs: Tensor | None = None  # (b,T) float, for a KL penalty

    @property
    def num_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Response tokens: the unit the "token-mean" normaliser counts."""
        return int(self.response_mask.sum().item())

    def to(self, device: str | torch.device) -> TrainMicroBatch:
        ref = None if self.ref_logprobs is None else self.ref_logprobs.to(device)
        return TrainMicroBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.old_logprobs.to(device),
            self.advantages.to(device),
            ref,
        )


def build_microbatch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    old_logprobs: Sequence[Sequence[float]],
    advantages: Sequence[float],
    pad_id: int,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
) -> TrainMicroBatch:
    """Concatenate prompt + response per sample, right-pad to the longest, build the masks.

    Raises ValueError naming the sample when lengths disagree or a prompt is empty.
    """
    b = len(prompts)
    lists: dict[str, Sequence[object]] = {
        "responses": responses,
        "old_logprobs": old_logprobs,
        "advantages": advantages,
    }
    if ref_logprobs is not None:
        lists["ref_logprobs"] = ref_logprobs
    for name, xs in lists.items():
        if len(xs) != b:
            raise ValueError(f"{name} has {len(xs)} entries but prompts has {b}")
    if b == 0:
        raise ValueError("a micro-batch needs at least one sample")
    for i in range(b):
        if len(prompts[i]) == 0:
            raise ValueError(f"sample {i}: empty prompt (the first token cannot be predicted)")
        if len(old_logprobs[i]) != len(responses[i]):
            raise ValueError(
                f"sample {i}: {len(responses[i])} response tokens but "
                f"{len(old_logprobs[i])} old_logprobs"
            )
        if ref_logprobs is not None and len(ref_logprobs[i]) != len(responses[i]):
            raise ValueError(f"sample {i}: ref_logprobs length differs from response length")
    seq_len = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attn = torch.zeros((b, seq_len), dtype=torch.long)
    resp = torch.zeros((b, seq_len), dtype=torch.float32)
    old = torch.zeros((b, seq_len), dtype=torch.float32)
    ref = torch.zeros((b, seq_len), dtype=torch.float32) if ref_logprobs is not None else None
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        n_p, n_r = len(p), len(r)
        ids[i, : n_p + n_r] = torch.tensor([*p, *r], dtype=torch.long)
        attn[i, : n_p + n_r] = 1
        resp[i, n_p : n_p + n_r] = 1.0
        old[i, n_p : n_p + n_r] = torch.tensor(old_logprobs[i], dtype=torch.float32)
        if ref is not None and ref_logprobs is not None:
            ref[i, n_p : n_p + n_r] = torch.tensor(ref_logprobs[i], dtype=torch.float32)
    adv = torch.tensor(list(advantages), dtype=torch.float32)
    return TrainMicroBatch(ids, attn, resp, old, adv, ref)


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """log πθ(x_t | x_<t) for every position, float32, column 0 = 0. (b,T) → (b,T)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (b,T-1,V)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (b,T-1)
    return F.pad(picked, (1, 0))  # (b,T)
