"""Sparse-RL's correction (`sparse_rl` anchor): a sequence with a token the dense old
policy finds 10⁴ times less likely than the sparse sampler did is rejected whole; a kept
token is weighted by ξ = π_old / π_sparse inside [0.5, 1.5] and masked outside; padding
never rejects or weighs anything. Checked against a case worked by hand."""

from __future__ import annotations

import math

import torch

from engines.training.losses import ANCHORS, SparseCorrection, anchor, sparse_rl_weights


def test_the_weights_of_a_hand_computed_case() -> None:
    # ξ per token (rows: sequences; the last column of row 1 is padding)
    xi = torch.tensor(
        [
            [1.0, 1.2, 0.4, 2.0],  # kept: 1.0, 1.2; 0.4 < 0.5 and 2.0 > 1.5 masked
            [0.9, 1.5, 0.5, 1e-6],  # padding's tiny ξ rejects nothing: 0.9, 1.5, 0.5
            [1.1, 5e-5, 1.0, 1.0],  # 5e-5 < 1e-4: the whole sequence is rejected
        ]
    )
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    behaviour = torch.log(torch.full_like(xi, 0.25))
    old = behaviour + torch.log(xi)
    w = sparse_rl_weights(old, behaviour, mask)
    want = torch.tensor([[1.0, 1.2, 0, 0], [0.9, 1.5, 0.5, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(w, want, rtol=1e-5, atol=1e-7)


def test_the_thresholds_are_the_paper_s() -> None:
    c = SparseCorrection()
    assert (c.reject_below, c.low, c.high) == (1e-4, 0.5, 1.5)


def test_the_anchor_is_the_dense_recompute_and_carries_no_gradient() -> None:
    logp = torch.tensor([[math.log(0.3), math.log(0.6)]], requires_grad=True)
    behaviour = torch.tensor([[math.log(0.3), math.log(0.5)]])
    old, w = anchor("sparse_rl", logp, behaviour, 2.0, torch.ones(1, 2))
    assert "sparse_rl" in ANCHORS and not old.requires_grad and w is not None
    torch.testing.assert_close(old, logp.detach())
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.2]]))
    assert not w.requires_grad
