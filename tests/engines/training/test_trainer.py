"""AgentTrainer: exact micro-batch accumulation, NaN skipping, batch building, errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from engines.training.batch import build_microbatch, token_logprobs
from engines.training.lora import LoraConfig
from engines.training.trainer import AgentTrainer, TrainConfig
from tests.engines.training.training_helpers import merge, qwen2_tied_config, random_batch

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def _clone(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in d.items()}


def _grads(tr: AgentTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", MODES)
def test_microbatch_accumulation_equals_full_batch(tiny_model: str, mode: str) -> None:
    cfg = TrainConfig(lr=1e-3, aggregation=mode, kl_coef=0.0)
    full_tr = AgentTrainer("a", tiny_model, cfg)
    acc_tr = AgentTrainer("a", tiny_model, cfg)
    for step in range(2):
        samples = random_batch(seed=10 * step + MODES.index(mode), n=8)
        full = merge(samples)
        parts = [merge(samples[:3]), merge(samples[3:4]), merge(samples[4:])]  # b = 3, 1, 4
        n_tok, n_seq = full.num_tokens, full.num_seqs
        full_tr.begin_step(n_tok, n_seq)
        full_tr.accumulate(full)
        acc_tr.begin_step(n_tok, n_seq)
        for mb in parts:
            acc_tr.accumulate(mb)
        g_full, g_acc = _grads(full_tr), _grads(acc_tr)
        assert g_full.keys() == g_acc.keys() and len(g_full) > 0
        for k in g_full:
            # float32 sums in another order: seq-mean-token-sum gradients reach ~1e-2
            torch.testing.assert_close(g_acc[k], g_full[k], rtol=1e-4, atol=1e-5)
        r_full, r_acc = full_tr.step(), acc_tr.step()
        assert r_acc.loss == pytest.approx(r_full.loss, rel=1e-5, abs=1e-7)
        assert (r_acc.version, r_acc.num_tokens, r_acc.num_seqs) == (step + 1, n_tok, n_seq)
        assert not r_acc.skipped
    w_full, w_acc = full_tr.weights(), acc_tr.weights()
    init = AgentTrainer("a", tiny_model, cfg).weights()
    moved = sum(float((w_full[k] - init[k]).abs().max()) for k in w_full)
    assert moved > 1e-3  # the steps did something
    for k in w_full:
        torch.testing.assert_close(w_acc[k], w_full[k], rtol=1e-4, atol=1e-5)


def test_nonfinite_step_is_skipped_bit_exactly(
    tiny_model: str, caplog: pytest.LogCaptureFixture
) -> None:
    tr = AgentTrainer("solver", tiny_model, TrainConfig(lr=1e-3))
    good = merge(random_batch(seed=1, n=4))
    tr.begin_step(good.num_tokens, good.num_seqs)
    tr.accumulate(good)
    assert tr.step().version == 1  # optimizer state now exists
    before = _clone(tr.state())
    bad = build_microbatch([[5, 6]], [[7, 8, 9]], [[-1.0, float("nan"), -1.0]], [1.0], pad_id=0)
    tr.begin_step(good.num_tokens + bad.num_tokens, good.num_seqs + 1)
    tr.accumulate(good)
    with caplog.at_level(logging.WARNING):
        tr.accumulate(bad)
        res = tr.step()
    assert res.skipped and res.version == 1 and tr.version == 1 and tr.skipped_steps == 1
    assert "step skipped" in caplog.text
    after = tr.state()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert all(p.grad is None for p in tr.model.parameters())
    tr.begin_step(good.num_tokens, good.num_seqs)  # training continues normally
    tr.accumulate(good)
    assert tr.step().version == 2


def test_inf_advantage_skips(tiny_model: str) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig())
    mb = build_microbatch([[5]], [[6, 7]], [[-4.0, -4.0]], [float("inf")], pad_id=0)
    tr.begin_step(mb.num_tokens, 1)
    tr.accumulate(mb)
    assert tr.step().skipped and tr.version == 0


def test_logprob_alignment_and_on_policy_ratio(tiny_model: str) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig())
    prompt, resp = [5, 9, 11], [20, 21, 22, 23]
    with torch.no_grad():
        logits = tr.model(input_ids=torch.tensor([prompt + resp])).logits[0]
    lp = torch.log_softmax(logits, -1)
    want = [float(lp[len(prompt) - 1 + j, tok]) for j, tok in enumerate(resp)]
    mb = build_microbatch([prompt, [5]], [resp, [6]], [want, [-1.0]], [1.0, -1.0], pad_id=0)
    with torch.no_grad():
        got = token_logprobs(tr.model, mb.input_ids, mb.attention_mask)
    assert mb.response_mask[0].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert mb.response_mask[1].tolist() == [0, 1, 0, 0, 0, 0, 0]
    torch.testing.assert_close(got[0, 3:], torch.tensor(want), rtol=1e-5, atol=1e-5)
    # behaviour anchor on exactly the model's own logprobs (sample 0): on-policy, r == 1
    tr_b = AgentTrainer("a", tiny_model, TrainConfig(old_logprobs="behaviour"))
    on_policy = build_microbatch([prompt], [resp], [want], [1.0], pad_id=0)
    tr_b.begin_step(on_policy.num_tokens, 1)
    metrics = tr_b.accumulate(on_policy)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["clip_frac"] == 0.0 and "loss" in metrics
    # recompute anchor: r == 1 in value whatever the stored logprobs say (sample 1's are off)
    tr.begin_step(mb.num_tokens, 2)
    metrics = tr.accumulate(mb)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["clip_frac"] == 0.0


def test_bf16_sampler_against_fp32_trainer_clips_only_with_the_behaviour_anchor(
    tmp_path: Path,
) -> None:
    """A bf16 sampler's logprobs differ from an fp32 trainer's by rounding alone. Anchored
    on them (`behaviour`), a tight clip fires on tokens that are on-policy; `recompute`
    anchors on the trainer's own logprobs (ratio exactly 1, no clip) and moves the gap into
    the truncated importance weight instead."""
    path = str(tmp_path / "m")
    torch.manual_seed(0)
    # peaked logits, as a trained model has: rounding then shows in the logprobs
    cfg = qwen2_tied_config(4096, initializer_range=0.2)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 4096, (6,), generator=g).tolist() for _ in range(8)]
    resps = [torch.randint(3, 4096, (12,), generator=g).tolist() for _ in range(8)]
    with torch.no_grad():
        ids = torch.tensor([p + r for p, r in zip(prompts, resps, strict=True)])
        lp = torch.log_softmax(sampler(input_ids=ids).logits.float(), -1)
    behaviour = [[float(lp[i, 6 - 1 + j, t]) for j, t in enumerate(r)] for i, r in enumerate(resps)]
    adv = [1.0, -1.0] * 4
    mb = build_microbatch(prompts, resps, behaviour, adv, pad_id=0)
    got = {}
    for anchor in ("behaviour", "recompute"):
        tr = AgentTrainer("a", path, TrainConfig(old_logprobs=anchor, clip_eps=0.01))
        tr.begin_step(mb.num_tokens, mb.num_seqs)
        got[anchor] = tr.accumulate(mb)
    assert got["behaviour"]["clip_frac"] > 0.05  # on-policy tokens clipped by rounding alone
    assert got["recompute"]["clip_frac"] == 0.0
    assert got["recompute"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert got["recompute"]["is_weight_mean"] != 1.0  # the gap, corrected instead of clipped


def test_trainer_errors(tiny_model: str) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig())
    mb = merge(random_batch(seed=3, n=2))
    with pytest.raises(RuntimeError, match="before begin_step"):
        tr.accumulate(mb)
    with pytest.raises(RuntimeError, match="without begin_step"):
        tr.step()
    with pytest.raises(ValueError, match="positive counts"):
        tr.begin_step(0, 1)
    tr.begin_step(mb.num_tokens + 5, 2)
    tr.accumulate(mb)
    with pytest.raises(ValueError, match="normaliser would be wrong"):
        tr.step()
    tr.release()
    with pytest.raises(RuntimeError, match="released"):
        tr.weights()


def test_config_and_batch_validation() -> None:
    with pytest.raises(KeyError, match="known: grpo, grpo_no_std"):
        TrainConfig(advantage="gae")
    with pytest.raises(KeyError, match="aggregation mode 'mean'"):
        TrainConfig(aggregation="mean")
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        TrainConfig(dtype="fp8")
    with pytest.raises(ValueError, match="r >= 1"):
        LoraConfig(r=0)
    with pytest.raises(ValueError, match="sample 1: 2 response tokens but 1 old_logprobs"):
        build_microbatch([[1], [1]], [[2], [3, 4]], [[0.0], [0.0]], [0.0, 0.0], pad_id=0)
    with pytest.raises(ValueError, match="sample 0: empty prompt"):
        build_microbatch([[]], [[2]], [[0.0]], [0.0], pad_id=0)
    with pytest.raises(ValueError, match="advantages has 1 entries but prompts has 2"):
        build_microbatch([[1], [1]], [[2], [3]], [[0.0], [0.0]], [0.0], pad_id=0)


def test_steps_move_probability_towards_positive_advantage(tiny_model: str) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-2, aggregation="seq-mean-token-mean"))
    prompt, good, bad = [5, 6], [30, 31, 32], [40, 41, 42]

    def token_lp() -> list[list[float]]:  # current policy's logprob of each response token
        mb = build_microbatch([prompt] * 2, [good, bad], [[0.0] * 3] * 2, [0.0, 0.0], pad_id=0)
        with torch.no_grad():
            lp = token_logprobs(tr.model, mb.input_ids, mb.attention_mask)
        return lp[:, len(prompt) :].tolist()

    before = [sum(x) for x in token_lp()]
    for _ in range(3):
        old = token_lp()  # on-policy behaviour logprobs: ratio 1
        mb = build_microbatch([prompt] * 2, [good, bad], old, [1.0, -1.0], pad_id=0)
        tr.begin_step(mb.num_tokens, 2)
        assert tr.accumulate(mb)["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        tr.step()
    after = [sum(x) for x in token_lp()]
    assert after[0] > before[0] and after[1] < before[1]


@pytest.mark.parametrize("mode", MODES)
def test_streaming_normalisation_equals_declared_counts(tiny_model: str, mode: str) -> None:
    """begin_step() without counts (the orchestrator's case) gives the same update."""
    cfg = TrainConfig(lr=1e-3, aggregation=mode)
    declared, streamed = AgentTrainer("a", tiny_model, cfg), AgentTrainer("a", tiny_model, cfg)
    samples = random_batch(seed=77 + MODES.index(mode), n=6)
    parts = [merge(samples[:2]), merge(samples[2:])]
    full = merge(samples)
    declared.begin_step(full.num_tokens, full.num_seqs)
    streamed.begin_step()
    assert streamed.pending
    for mb in parts:
        declared.accumulate(mb)
        streamed.accumulate(mb)
    r_d, r_s = declared.step(), streamed.step()
    assert not streamed.pending
    assert r_s.loss == pytest.approx(r_d.loss, rel=1e-5, abs=1e-7)
    assert r_s.grad_norm == pytest.approx(r_d.grad_norm, rel=1e-5)
    # loss and grad norm above pin the normalisation; Adam's first update is lr·g/(|g|+ε),
    # so for a gradient element near 0 the float summation order alone moves the weight by
    # a fraction of lr (seen: 2e-5 at lr 1e-3 on one element of 8192): tolerance 5% of lr
    w_d, w_s = declared.weights(), streamed.weights()
    for k in w_d:
        torch.testing.assert_close(w_s[k], w_d[k], rtol=1e-4, atol=0.05 * cfg.lr)


def test_begin_step_needs_both_counts_or_neither(tiny_model: str) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig())
    with pytest.raises(ValueError, match="both"):
        tr.begin_step(10, None)


def test_a_step_of_empty_micro_batches_updates_nothing(tiny_model: str) -> None:
    """An agent whose turns were all skipped (a loop that stopped early) has a step with no
    rows: no update, the version stays, the step is recorded as skipped, and the next step
    trains as usual."""
    tr = AgentTrainer("a", tiny_model, TrainConfig())
    before = {k: v.clone() for k, v in tr.weights().items()}
    tr.begin_step(step=0)
    tr.accumulate_empty(0)
    tr.accumulate_empty(1)
    result = tr.step(expect={0: (0, 0), 1: (0, 0)})
    assert result.skipped and result.version == tr.version == 0 and result.num_seqs == 0
    assert all(torch.equal(before[k], v) for k, v in tr.weights().items())
    mb = merge(random_batch(seed=3, n=2))
    tr.begin_step(step=1)
    tr.accumulate(mb, part=0)
    assert tr.step().version == 1
