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
import torch.utils.checkpoint
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
    echo_mask: Tensor | None = None  # (b,T) float, 1 on EchoRL clip tokens (echo.py)
    external: Tensor | None = None  # (b,) float, 1 on rows an external policy sampled

    @property
    def num_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Response tokens: the unit the "token-mean" normaliser counts."""
        return int(self.response_mask.sum().item())

    def rows(self, index: Tensor) -> TrainMicroBatch:
        """The sequences at `index` (a 1-D long tensor), padding as it is."""
        ref = None if self.ref_logprobs is None else self.ref_logprobs[index]
        echo = None if self.echo_mask is None else self.echo_mask[index]
        ext = None if self.external is None else self.external[index]
        return TrainMicroBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.response_mask[index],
            self.old_logprobs[index],
            self.advantages[index],
            ref,
            echo,
            ext,
        )

    def to(self, device: str | torch.device) -> TrainMicroBatch:
        ref = None if self.ref_logprobs is None else self.ref_logprobs.to(device)
        echo = None if self.echo_mask is None else self.echo_mask.to(device)
        ext = None if self.external is None else self.external.to(device)
        return TrainMicroBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.old_logprobs.to(device),
            self.advantages.to(device),
            ref,
            echo,
            ext,
        )


def build_microbatch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    old_logprobs: Sequence[Sequence[float]],
    advantages: Sequence[float],
    pad_id: int,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
    echo_lengths: Sequence[int] | None = None,
    external: Sequence[bool] | None = None,
) -> TrainMicroBatch:
    """Concatenate prompt + response per sample, right-pad to the longest, build the masks.

    `echo_lengths[i]`: the first that many response tokens of sample i are an EchoRL clip
    (`echo_mask`; None or all 0: no mask). `external[i]`: sample i was sampled by an
    external policy (`TrainMicroBatch.external`; None or none: no flags).

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
    if echo_lengths is not None:
        lists["echo_lengths"] = echo_lengths
    if external is not None:
        lists["external"] = external
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
        if echo_lengths is not None and not 0 <= echo_lengths[i] <= len(responses[i]):
            raise ValueError(
                f"sample {i}: echo clip of {echo_lengths[i]} tokens for a response of "
                f"{len(responses[i])}"
            )
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
    echo = None
    if echo_lengths is not None and any(echo_lengths):
        echo = torch.zeros((b, seq_len), dtype=torch.float32)
        for i, (p, n_e) in enumerate(zip(prompts, echo_lengths, strict=True)):
            echo[i, len(p) : len(p) + n_e] = 1.0
    ext = None
    if external is not None and any(external):
        ext = torch.tensor([float(bool(e)) for e in external], dtype=torch.float32)
    return TrainMicroBatch(ids, attn, resp, old, adv, ref, echo, ext)


# ---- token logprobs ---------------------------------------------------------------------------
#
# Logit post-processing that HF causal LMs apply *after* `lm_head` in their `*ForCausalLM.forward`
# (so it is missing when the head is applied to the backbone's hidden states here). Keyed by
# `config.model_type` rather than by attribute name alone: e.g. MPT's config has a `logit_scale`
# that its HF modeling code never uses. Final-logit soft-capping (`final_logit_softcapping`:
# Gemma 2/3/3n/4, nanochat) is read from any text config that sets it.
_LOGIT_MULTIPLIER: dict[str, str] = {  # logits * config.<attr>
    "cohere": "logit_scale",
    "cohere2": "logit_scale",
    "cohere2_moe": "logit_scale",
    "falcon_h1": "lm_head_multiplier",
}
_LOGIT_DIVISOR: dict[str, str] = {  # logits / config.<attr> (MiniCPM3 divides the hidden states)
    "granite": "logits_scaling",
    "granitemoe": "logits_scaling",
    "granitemoeshared": "logits_scaling",
    "granitemoehybrid": "logits_scaling",
    "granitemoe_swa": "logits_scaling",
    "minicpm3": "logits_scaling",
}


def _logit_transform(model: torch.nn.Module) -> tuple[float, float | None]:
    """(scale, softcap) so that the model's logits = softcap(scale · lm_head(h))."""
    config = getattr(model, "config", None)
    if config is None:
        return 1.0, None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind = getattr(text, "model_type", "")
    scale = 1.0
    if kind in _LOGIT_MULTIPLIER:
        scale = float(getattr(text, _LOGIT_MULTIPLIER[kind]))
    elif kind in _LOGIT_DIVISOR:
        scale = 1.0 / float(getattr(text, _LOGIT_DIVISOR[kind]))
    cap = getattr(text, "final_logit_softcapping", None)
    return scale, None if cap is None else float(cap)


def _positions(input_ids: Tensor, response_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """(rows, cols) of the scored tokens: response positions, or every column 1..T-1."""
    if response_mask is None:
        sel = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
        sel[:, 0] = False
    else:
        if response_mask.shape != input_ids.shape:
            raise ValueError(
                f"response_mask {tuple(response_mask.shape)} != input_ids {tuple(input_ids.shape)}"
            )
        sel = response_mask.to(device=input_ids.device) != 0
        if bool(sel[:, 0].any()):
            raise ValueError("response_mask[:, 0] must be 0: the first token has no prediction")
    rows, cols = sel.nonzero(as_tuple=True)  # row-major order, (N,) each
    return rows, cols


def _chunk_logprobs(
    head: torch.nn.Module,
    h: Tensor,  # (n,H) hidden states of the predicting positions
    targets: Tensor,  # (n,) long
    scale: float,
    softcap: float | None,
    temperature: float,
) -> Tensor:  # (n,) float32
    logits = head(h).float()  # (n,V)
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)  # (n,V): = logits - logsumexp(logits)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (n,)


def check_logprob_args(temperature: float, chunk_tokens: int) -> None:
    """The arguments every logprob path refuses: a non-positive temperature or chunk."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")


def backbone_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(backbone, lm_head) of an HF causal LM (`get_decoder()`, `get_output_embeddings()`),
    or None for a model without both (it is then scored on the full-vocabulary path)."""
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = get_head() if callable(get_head) else None
    if decoder is None or decoder is model or head is None:
        return None
    return decoder, head


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
) -> Tensor:
    """log softmax(logits / temperature)[x_t] at the response positions, 0 elsewhere.

    (b,T) → (b,T) float32, differentiable; `response_mask=None` scores every position
    1..T-1 (column 0 has no prediction). Equal to `_token_logprobs_full` at the scored
    positions, but never materialises (b,T,V) logits:

    1. the backbone (`model.get_decoder()`, which is the `*Model` of Llama/Qwen2/Qwen3/GPT-2/
       Gemma/Cohere/Granite causal LMs) gives hidden states (b,T,H), incl. the final norm;
    2. the hidden states at t-1 of every scored token t are gathered into (N,H);
    3. `model.get_output_embeddings()` (the lm_head; tied or not) is applied in chunks of
       `chunk_tokens` rows, each under a non-reentrant activation checkpoint, so backward
       recomputes that chunk's (chunk_tokens, V) logits instead of keeping all N×V alive.
       The chunk takes `log_softmax(...).gather(...)` (= logit − logsumexp): its backward is
       the reference's per element, and it keeps one (chunk, V) buffer fewer than
       `gather − logsumexp` (peak ≈ 3 such buffers in backward);
    4. family-specific logit post-processing is applied in float32: the multipliers in
       `_LOGIT_MULTIPLIER`/`_LOGIT_DIVISOR` and Gemma's `final_logit_softcapping`. A family
       whose `*ForCausalLM.forward` does anything else between `lm_head` and the returned
       logits (or whose backbone output is not what the head consumes) needs an entry there.

    Models without `get_decoder`/`get_output_embeddings` (not an HF causal LM) fall back to
    the full-vocabulary path. Train/eval mode is left as the caller set it.
    """
    check_logprob_args(temperature, chunk_tokens)
    parts = backbone_and_head(model)
    if parts is None:
        return _token_logprobs_full(
            model, input_ids, attention_mask, response_mask, temperature=temperature
        )
    decoder, head = parts
    rows, cols = _positions(input_ids, response_mask)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if rows.numel() == 0:  # nothing to score: still usable in `(logp * mask).sum().backward()`
        return out.requires_grad_(torch.is_grad_enabled())
    out_dec = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = out_dec[0]  # (b,T,H) last_hidden_state (ModelOutput or tuple)
    h = hidden[rows, cols - 1]  # (N,H): position t-1 predicts token t
    targets = input_ids[rows, cols]  # (N,)
    picked = head_logprobs(model, head, h, targets, temperature, chunk_tokens)  # (N,)
    return out.index_put((rows, cols), picked)


def head_logprobs(
    model: torch.nn.Module,
    head: torch.nn.Module,
    h: Tensor,  # (N,H) hidden states of the predicting positions
    targets: Tensor,  # (N,) long
    temperature: float,
    chunk_tokens: int,
) -> Tensor:  # (N,) float32
    """Steps 3–4 of `token_logprobs`: the lm_head in checkpointed chunks of `chunk_tokens`
    rows, with `model`'s logit post-processing; each row is independent of the others, so
    the rows may come in any order (`packing.grouped_token_logprobs` gathers them from
    several backbone passes)."""
    scale, softcap = _logit_transform(model)
    parts = []
    for s in range(0, h.shape[0], chunk_tokens):
        parts.append(
            torch.utils.checkpoint.checkpoint(
                _chunk_logprobs,
                head,
                h[s : s + chunk_tokens],
                targets[s : s + chunk_tokens],
                scale,
                softcap,
                temperature,
                use_reentrant=False,
            )
        )
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _token_logprobs_full(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
) -> Tensor:
    """Reference: the full-vocabulary float32 log_softmax over every position (b,T,V).

    Same signature and result as `token_logprobs` (`chunk_tokens` is ignored); memory is
    O(b·T·V), kept for tests and `bench/training.py`.
    """
    del chunk_tokens
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # (b,T-1,V)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (b,T-1)
    picked = F.pad(picked, (1, 0))  # (b,T)
    if response_mask is None:
        return picked
    return torch.where(response_mask.to(picked.device) != 0, picked, 0.0)
