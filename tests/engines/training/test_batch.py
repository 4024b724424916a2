"""token_logprobs: the response-only, chunked, checkpointed path equals the full-vocab reference."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    CohereConfig,
    Gemma2Config,
    GPT2Config,
    GraniteConfig,
    LlamaConfig,
    PretrainedConfig,
)

from engines.training.batch import _token_logprobs_full, token_logprobs
from tests.engines.training.training_helpers import qwen2_tied_config

VOCAB = 2048


def _llama() -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )


def _qwen2_tied() -> PretrainedConfig:
    return qwen2_tied_config(VOCAB)


def _gpt2() -> PretrainedConfig:
    return GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=2,
        n_positions=128,
        bos_token_id=1,
        eos_token_id=2,
    )


def _gemma2() -> PretrainedConfig:  # final_logit_softcapping, set low so that it matters
    return Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=128,
        final_logit_softcapping=0.5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _cohere() -> PretrainedConfig:  # logits * logit_scale
    return CohereConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        logit_scale=0.25,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _granite() -> PretrainedConfig:  # logits / logits_scaling
    return GraniteConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        logits_scaling=4.0,
    )


FAMILIES: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": _llama,
    "qwen2_tied": _qwen2_tied,
    "gpt2": _gpt2,
}


def make_model(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    fn = FAMILIES.get(name) or {"gemma2": _gemma2, "cohere": _cohere, "granite": _granite}[name]
    cfg = fn()
    cfg.attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()  # GPT-2 has dropout: compare deterministic forwards


def make_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """3 right-padded rows of ragged prompt + response lengths."""
    g = torch.Generator().manual_seed(seed)
    lens = [(3, 9), (5, 4), (1, 12)]  # (prompt, response)
    t = max(p + r for p, r in lens)
    ids = torch.zeros((len(lens), t), dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros((len(lens), t), dtype=torch.float32)
    for i, (p, r) in enumerate(lens):
        ids[i, : p + r] = torch.randint(3, VOCAB, (p + r,), generator=g)
        attn[i, : p + r] = 1
        resp[i, p : p + r] = 1.0
    return ids, attn, resp


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _run(
    fn: Callable[..., torch.Tensor],
    model: torch.nn.Module,
    ids: torch.Tensor,
    attn: torch.Tensor,
    resp: torch.Tensor | None,
    **kw: float | int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    lp = fn(model, ids, attn, resp, **kw)
    w = torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)  # weighted: not just d/dsum
    mask = resp if resp is not None else torch.ones_like(lp)
    (lp * w * mask).sum().backward()
    return lp.detach(), _grads(model)


def _assert_grads_close(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], atol: float, rtol: float
) -> None:
    assert got.keys() == ref.keys() and len(got) > 3
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=atol, rtol=rtol, msg=n)


@pytest.mark.parametrize("family", ["llama", "qwen2_tied", "gpt2", "gemma2", "cohere", "granite"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_reference_values_and_grads(family: str, temperature: float) -> None:
    model = make_model(family)
    ids, attn, resp = make_inputs()
    ref, ref_g = _run(_token_logprobs_full, model, ids, attn, resp, temperature=temperature)
    got, got_g = _run(token_logprobs, model, ids, attn, resp, temperature=temperature)
    assert got.dtype == torch.float32 and got.shape == ids.shape
    on = resp.bool()
    torch.testing.assert_close(got[on], ref[on], atol=1e-5, rtol=1e-5)
    assert (got[~on] == 0).all()
    assert (got[on] < 0).all()
    _assert_grads_close(got_g, ref_g, atol=1e-5, rtol=1e-4)


def test_reference_matches_plain_log_softmax() -> None:
    """The reference itself is `log_softmax(model logits / T)` picked at the next token."""
    model = make_model("llama")
    ids, attn, resp = make_inputs()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits
        want = torch.log_softmax(logits[:, :-1].float() / 0.7, -1)
        want = want.gather(-1, ids[:, 1:, None]).squeeze(-1)
        got = _token_logprobs_full(model, ids, attn, resp, temperature=0.7)
    torch.testing.assert_close(got[:, 1:], want * resp[:, 1:])


def test_tied_embedding_gets_both_gradients() -> None:
    model = make_model("qwen2_tied")
    head = model.get_output_embeddings()
    emb = model.get_input_embeddings()
    assert head is not None and head.weight is emb.weight
    ids, attn, resp = make_inputs()
    _, got_g = _run(token_logprobs, model, ids, attn, resp)
    _, ref_g = _run(_token_logprobs_full, model, ids, attn, resp)
    name = next(n for n, p in model.named_parameters() if p is emb.weight)
    torch.testing.assert_close(got_g[name], ref_g[name], atol=1e-5, rtol=1e-4)
    # rows of tokens that never occur as inputs only get the head's gradient: non-zero too
    unused = torch.ones(VOCAB, dtype=torch.bool)
    unused[ids.flatten()] = False
    assert got_g[name][unused].abs().sum() > 0
    assert got_g[name][ids[0, 0]].abs().sum() > 0


@pytest.mark.parametrize("chunk", [1, 5, 7, 1024])
def test_chunk_size_does_not_change_values_or_grads(chunk: int) -> None:
    model = make_model("qwen2_tied")
    ids, attn, resp = make_inputs()
    n = int(resp.sum())
    assert n == 25  # chunks 1, 5, 7 split N into 25, 5, 4 pieces (the last one short)
    ref, ref_g = _run(token_logprobs, model, ids, attn, resp, chunk_tokens=n)
    got, got_g = _run(token_logprobs, model, ids, attn, resp, chunk_tokens=chunk)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    _assert_grads_close(got_g, ref_g, atol=1e-5, rtol=1e-4)  # summation order


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_no_response_mask_is_the_old_behaviour(family: str) -> None:
    model = make_model(family)
    ids, attn, _ = make_inputs()
    ref, ref_g = _run(_token_logprobs_full, model, ids, attn, None)
    got, got_g = _run(token_logprobs, model, ids, attn, None, chunk_tokens=8)
    assert (got[:, 0] == 0).all() and (got[:, 1:] < 0).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    _assert_grads_close(got_g, ref_g, atol=1e-5, rtol=1e-4)
    # the old three-argument call still works
    torch.testing.assert_close(token_logprobs(model, ids, attn).detach(), ref)


def test_bf16_model_close_to_reference() -> None:
    model = make_model("qwen2_tied", torch.bfloat16)
    ids, attn, resp = make_inputs()
    ref, ref_g = _run(_token_logprobs_full, model, ids, attn, resp, temperature=0.7)
    got, got_g = _run(token_logprobs, model, ids, attn, resp, temperature=0.7, chunk_tokens=4)
    assert got.dtype == torch.float32
    on = resp.bool()
    torch.testing.assert_close(got[on], ref[on], atol=2e-2, rtol=2e-2)
    assert (got[~on] == 0).all()
    for n in ref_g:
        torch.testing.assert_close(got_g[n].float(), ref_g[n].float(), atol=5e-2, rtol=5e-2)


def test_mode_untouched_and_deterministic() -> None:
    model = make_model("llama").train()
    ids, attn, resp = make_inputs()
    a = token_logprobs(model, ids, attn, resp, chunk_tokens=3)
    b = token_logprobs(model, ids, attn, resp, chunk_tokens=3)
    assert model.training
    assert torch.equal(a, b)


def test_empty_response_and_bad_inputs() -> None:
    model = make_model("llama")
    ids, attn, resp = make_inputs()
    out = token_logprobs(model, ids, attn, torch.zeros_like(resp))
    assert out.shape == ids.shape and (out == 0).all()
    out.sum().backward()  # an all-prompt micro-batch does not break the trainer's backward
    bad = resp.clone()
    bad[0, 0] = 1
    with pytest.raises(ValueError, match="response_mask"):
        token_logprobs(model, ids, attn, bad)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, ids, attn, resp, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs(model, ids, attn, resp, chunk_tokens=0)
