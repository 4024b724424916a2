"""bfloat16 agents train like float32 ones: float32 master weights and AdamW moments, the
forward under autocast, bf16 weights published.

Before float32 masters, one AdamW step at lr 1e-6 (the paper's learning rate) moved about 2%
of a bf16 model's weights: an update below ~2^-8 of a weight's magnitude rounds away."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.training.checkpoint import export_hf
from engines.training.trainer import AgentTrainer, TrainConfig
from tests.engines.training.training_helpers import merge, random_batch

LR = 1e-6


def one_step(
    model: str, dtype: str, lr: float = LR
) -> tuple[AgentTrainer, dict[str, torch.Tensor]]:
    """A trainer of `dtype`, one AdamW step on a fixed batch; the weights before it."""
    tr = AgentTrainer("a", model, TrainConfig(lr=lr, dtype=dtype, seed=0))
    before = {k: v.clone() for k, v in tr.state().items() if k.startswith("model/")}
    mb = merge(random_batch(seed=11, n=8))
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    result = tr.step()
    assert not result.skipped and result.version == 1
    return tr, before


def deltas(tr: AgentTrainer, before: dict[str, torch.Tensor]) -> torch.Tensor:
    after = tr.state()
    return torch.cat([(after[k].double() - v.double()).flatten() for k, v in before.items()])


def test_a_bf16_step_at_lr_1e6_moves_every_weight_with_a_gradient(tiny_model: str) -> None:
    tr, before = one_step(tiny_model, "bfloat16")
    state = tr.state()
    assert all(state[k].dtype == torch.float32 for k in before)  # masters
    moments = [v for k, v in state.items() if k.endswith("exp_avg") or k.endswith("exp_avg_sq")]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    # which elements had a gradient: AdamW's first moment is (1 - beta1) * grad after step 1
    had_grad = torch.cat(
        [state[f"optim/{k[len('model/') :]}/exp_avg"].flatten() != 0 for k in before]
    )
    moved = deltas(tr, before) != 0
    assert had_grad.float().mean() > 0.5  # the batch reaches most weights
    fraction = (moved & had_grad).sum() / had_grad.sum()
    assert fraction >= 0.99, f"only {float(fraction):.3f} of the weights with a gradient moved"
    assert not (moved & ~had_grad).any()  # weight decay is 0: nothing else moves


def test_the_bf16_update_matches_the_fp32_update(tiny_model: str) -> None:
    """Same batch, same start: the bf16 step's update is the fp32 step's to within what bf16
    arithmetic in the forward and backward changes (AdamW's first step is ≈ lr·sign(g), so
    the update differs only where a gradient's sign flips under bf16 rounding)."""
    d16 = deltas(*one_step(tiny_model, "bfloat16"))
    d32 = deltas(*one_step(tiny_model, "float32"))
    cos = torch.nn.functional.cosine_similarity(d16, d32, dim=0)
    assert cos > 0.99, f"cosine {float(cos):.4f}"
    rel = (d16 - d32).norm() / d32.norm()
    assert rel < 0.15, f"relative difference {float(rel):.4f}"
    # AdamW's first step: |Δ| = lr·|g|/(|g| + eps) ≤ lr, up to the float32 rounding of w + Δ
    assert d16.abs().max() <= 1.05 * LR


def test_bf16_agents_publish_and_export_bf16_and_checkpoint_fp32(
    tiny_model: str, tmp_path: Path
) -> None:
    tr, _ = one_step(tiny_model, "bfloat16")
    published = tr.weights()
    assert published and all(v.dtype == torch.bfloat16 for v in published.values())
    masters = {k[len("model/") :]: v for k, v in tr.state().items() if k.startswith("model/")}
    assert set(published) == set(masters)
    for k, v in published.items():  # the publication is the masters, rounded once
        assert torch.equal(v, masters[k].to(torch.bfloat16)), k
    fp32, _ = one_step(tiny_model, "float32")
    assert all(v.dtype == torch.float32 for v in fp32.weights().values())
    out = export_hf(tr, tmp_path / "export")  # what the rollout served, and says so
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    exported = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert exported.dtype == torch.bfloat16
    name = next(iter(published))
    assert torch.equal(exported.state_dict()[name], published[name])


def test_a_bf16_checkpoint_of_old_bf16_tensors_loads_into_fp32_masters(tiny_model: str) -> None:
    """A state written before float32 masters (bf16 weights and moments) is upcast on load,
    and the next step runs (AdamW refuses moments of another dtype than the parameter)."""
    tr, _ = one_step(tiny_model, "bfloat16")
    old = {
        k: v.to(torch.bfloat16) if v.is_floating_point() and not k.endswith("/step") else v
        for k, v in tr.state().items()
    }
    fresh = AgentTrainer("a", tiny_model, TrainConfig(lr=LR, dtype="bfloat16"))
    fresh.load_state(old, tr.meta())
    assert all(v.dtype == torch.float32 for k, v in fresh.state().items() if "rng" not in k)
    mb = merge(random_batch(seed=12, n=4))
    fresh.begin_step(mb.num_tokens, mb.num_seqs)
    fresh.accumulate(mb)
    assert fresh.step().version == 2


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_loss_and_logprobs_are_float32(tiny_model: str, dtype: str) -> None:
    from engines.training.batch import token_logprobs
    from engines.training.train_config import autocast

    tr = AgentTrainer("a", tiny_model, TrainConfig(dtype=dtype))
    mb = merge(random_batch(seed=3, n=4))
    with torch.no_grad(), autocast(tr.device, dtype):
        logp = token_logprobs(tr.model, mb.input_ids, mb.attention_mask, mb.response_mask)
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()
