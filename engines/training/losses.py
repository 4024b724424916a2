"""Per-token policy losses. Aggregation over tokens and sequences lives in `aggregate.py`.

All losses share one signature::

    fn(logprobs (B,T), old_logprobs (B,T), advantages (B,), mask (B,T), *,
       clip_eps, clip_eps_high=None, ref_logprobs=None, kl_coef=0.0)
       -> (loss_tok (B,T), metrics: dict[str, Tensor])

`old_logprobs` are the *behaviour* logprobs the rollout engine stored in the MEG Store next to
each token, not a recomputation: the importance ratio r = exp(logπθ − logπ_behaviour) is 1 in
value on-policy (flex/sync modes, up to sampler/trainer numerics) and corrects for staleness in
`async(η)` mode, with the same code. Metrics are detached scalars averaged over masked tokens
of *this* micro-batch (diagnostics only; they never enter a gradient).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from engines.training.registry import Registry

PolicyLossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: `@register_policy_loss("grpo")`."""
    return POLICY_LOSSES.register(name)


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(πθ ‖ π_ref): exp(d) − d − 1 with d = log π_ref − log πθ.

    Unbiased, always ≥ 0, low variance (Schulman, "Approximating KL divergence"); the form
    used by DeepSeekMath's GRPO and TRL. (B,T), (B,T) → (B,T).
    """
    d = ref_logprobs - logprobs  # (B,T)
    return torch.exp(d) - d - 1.0


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _check_shapes(logprobs: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> None:
    if logprobs.ndim != 2 or old.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            "logprobs, old_logprobs and mask must all be (B,T); got "
            f"{tuple(logprobs.shape)}, {tuple(old.shape)}, {tuple(mask.shape)}"
        )
    if adv.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (B,)={logprobs.shape[:1]}, got {tuple(adv.shape)}")


def clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    clip_eps_high: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO/GRPO per-token loss: −min(r·A, clip(r, 1−ε, 1+ε_high)·A) + β·KL_k3(πθ ‖ π_ref).

    `clip_eps_high` (DAPO's "clip-higher") defaults to `clip_eps`. The KL term needs
    `ref_logprobs` whenever `kl_coef` > 0.
    """
    _check_shapes(logprobs, old_logprobs, advantages, mask)
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)  # (B,T)
    adv = advantages.unsqueeze(1)  # (B,1)
    surr1 = ratio * adv  # (B,T)
    surr2 = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_hi) * adv  # (B,T)
    loss = -torch.min(surr1, surr2)  # (B,T)
    m = mask.to(loss.dtype)
    metrics = {
        "ratio_mean": _masked_mean(ratio.detach(), m),
        "clip_frac": _masked_mean((surr2 < surr1).to(loss.dtype).detach(), m),
    }
    if kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (B,T); pass them or set kl_coef=0")
        kl = k3_kl(logprobs, ref_logprobs)  # (B,T)
        loss = loss + kl_coef * kl
        metrics["kl"] = _masked_mean(kl.detach(), m)
    return loss, metrics


@register_policy_loss("grpo")
def grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **kw: object
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO (DeepSeekMath) = the clipped surrogate + k3 KL to a reference, per token.

    With aggregation "seq-mean-token-mean" this is TRL's `loss_type="grpo"`; with "token-mean"
    it is TRL's "bnpo"/DAPO's token-level loss.
    """
    return clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kw)  # type: ignore[arg-type]


@register_policy_loss("dr_grpo")
def dr_grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **kw: object
) -> tuple[Tensor, dict[str, Tensor]]:
    """Dr.GRPO ("GRPO done right", Liu et al. 2025): the same per-token clipped surrogate.

    Dr.GRPO's two fixes are not per-token: it drops the std normalisation of advantages
    (use advantage "grpo_no_std") and the per-sequence length normalisation (use aggregation
    "seq-mean-token-sum", a constant normaliser). Registered separately so a config names
    the algorithm it means, and so the variant can diverge without touching "grpo".
    """
    return clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kw)  # type: ignore[arg-type]


def policy_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    **kw: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Look up policy loss `name` and apply it → (loss_tok (B,T), metrics)."""
    return POLICY_LOSSES.get(name)(logprobs, old_logprobs, advantages, mask, **kw)
