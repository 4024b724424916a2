"""The correction of an external policy's rows (`external` anchor): LUFFY's policy shaping
of the ratio x = πθ/μ under the learner, f(x) = x/(x+γ). The per-token weight is
γ·x/(x+γ)² (a hand-computed case), the gradient of a row is exactly that of −f(x)·A with no
clip (autograd on the trainer's own objective), the agent's own rows keep `recompute`'s
truncated weight, and no other anchor takes external rows."""

from __future__ import annotations

import math

import pytest
import torch

from engines.training.batch import build_microbatch
from engines.training.losses import anchor, clipped_surrogate, shaped_is_weights
from engines.training.objective import token_objective
from engines.training.train_config import TrainConfig


def test_the_weights_of_a_hand_computed_case() -> None:
    # x = πθ/μ per token: 2, 0.1 (= γ, the largest weight, 1/4), 0.01, 1
    learner = torch.tensor([[0.5, 0.05, 0.005, 0.3]])
    sampler = torch.tensor([[0.25, 0.5, 0.5, 0.3]])
    w = shaped_is_weights(learner.log(), sampler.log(), gamma=0.1)
    want = [0.1 * 2 / 2.1**2, 0.25, 0.1 * 0.01 / 0.11**2, 0.1 / 1.1**2]
    torch.testing.assert_close(w, torch.tensor([want]), rtol=1e-5, atol=1e-8)
    assert not w.requires_grad


def test_an_external_row_s_gradient_is_that_of_the_shaped_objective() -> None:
    """Through the clipped surrogate at ratio 1 (one optimizer step a batch), the external
    row's gradient equals ∇(−f(πθ/μ)·A) even where a clip at 0.2 would bind (x = 2)."""
    torch.manual_seed(0)
    theta = torch.randn(2, 3, requires_grad=True)
    behaviour = torch.log(torch.tensor([[0.1, 0.6, 0.2], [0.3, 0.3, 0.05]]))
    adv, mask, gamma = torch.tensor([1.5, -0.7]), torch.ones(2, 3), 0.1
    external = torch.tensor([0.0, 1.0])

    logp = torch.log_softmax(theta, dim=-1)
    old, w = anchor("external", logp, behaviour, 2.0, mask, external, gamma)
    loss, _ = clipped_surrogate(logp, old, adv, mask, clip_eps=0.2, is_weights=w)
    (got,) = torch.autograd.grad(loss[1].sum(), theta)

    logp = torch.log_softmax(theta, dim=-1)
    x = torch.exp(logp[1] - behaviour[1])
    (want,) = torch.autograd.grad((-(x / (x + gamma)) * adv[1]).sum(), theta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # the agent's own row: recompute's truncated weight min(π/μ, cap), untouched
    own = torch.exp(logp[0].detach() - behaviour[0]).clamp(max=2.0)
    torch.testing.assert_close(w[0], own)


def test_only_the_external_anchor_takes_external_rows() -> None:
    logp, mask = torch.log(torch.tensor([[0.5, 0.5]])), torch.ones(1, 2)
    with pytest.raises(ValueError, match="1 rows of this micro-batch were sampled by an external"):
        anchor("recompute", logp, logp, 2.0, mask, torch.tensor([1.0]))
    # no external row: the anchors are as they were
    assert anchor("recompute", logp, logp, 2.0, mask, torch.tensor([0.0]))[1] is not None
    torch.testing.assert_close(
        anchor("external", logp, logp - 0.1, 2.0, mask)[1],
        anchor("recompute", logp, logp - 0.1, 2.0, mask)[1],
    )


def test_the_microbatch_carries_the_flags_and_the_objective_reports_their_share() -> None:
    mb = build_microbatch(
        [[1], [1, 2]], [[3, 4, 5], [6]], [[-1.0] * 3, [-1.0]], [1.0, 1.0], 0, external=[True, 0]
    )
    assert mb.external is not None and mb.external.tolist() == [1.0, 0.0]
    assert mb.rows(torch.tensor([1])).external.tolist() == [0.0]  # type: ignore[union-attr]
    assert build_microbatch([[1]], [[3]], [[-1.0]], [1.0], 0, external=[False]).external is None
    logp = torch.full((2, 4), math.log(0.5))  # (b, T): T = 1 + 3 tokens
    cfg = TrainConfig(old_logprobs="external", shaping=0.2)
    _, metrics = token_objective(cfg, logp, mb, None)
    assert metrics["external_frac"].item() == pytest.approx(3 / 4)  # 3 of the 4 tokens
    with pytest.raises(ValueError, match="shaping must be > 0"):
        TrainConfig(shaping=0.0)
