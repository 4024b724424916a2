"""Per-token policy losses. Aggregation over tokens and sequences lives in `aggregate.py`.

All losses share one signature::

    fn(logprobs (B,T), old_logprobs (B,T), advantages (B,), mask (B,T), *,
       clip_eps, clip_eps_high=None, dual_clip=None, ref_logprobs=None, kl_coef=0.0,
       is_weights=None)
       -> (loss_tok (B,T), metrics: dict[str, Tensor])

`old_logprobs` is the PPO *anchor*. The trainer chooses it per agent (`old_logprobs:` in the
spec, see `engines/training/trainer.py`):

- `behaviour`: the logprobs the rollout engine stored next to each token. The ratio
  r = exp(logπθ − logμ) then also carries every sampler/trainer numeric difference (a bf16
  vLLM against an fp32 trainer clips on-policy tokens) and, in `async(η)`, the staleness.
- `recompute` (default): the trainer's own logprobs of the batch before the update. We take
  one optimizer step per global batch, so that is the detached logprob of the same forward
  pass: r ≡ 1 in value, the clip never fires on-policy, and the sampler mismatch (and any
  staleness) is corrected instead by a truncated importance weight
  `is_weights = min(exp(logπ_old − logμ), cap)`, detached (TIS; TRL's
  `vllm_importance_sampling_cap`, verl's `tis_imp_ratio_cap`; AReaL's decoupled PPO uses the
  same split between a proximal anchor and the behaviour policy).
- `sparse_rl`: `recompute`'s anchor for rollouts sampled from a compressed KV cache (the
  `sparse` rollout policy): the weight is Sparse-RL's rejection and reweighting
  (`SparseCorrection`) instead of the truncation.
- `external`: `recompute` on the agent's own rows; on a row an external policy sampled (a
  frozen model, a teammate: the `external` rollout policy) the weight is LUFFY's policy
  shaping of the importance ratio under the learner (`shaped_is_weights`), which gives that
  row exactly the gradient of −f(πθ/μ)·A, f(x) = x/(x+γ), unclipped.

The log-ratio is clamped to ±LOG_RATIO_CLAMP (as verl) before `exp`, so one stale or
mis-sampled token cannot overflow to inf, whose product with a zero advantage is NaN and would
skip the whole step. Metrics are detached scalars averaged over masked tokens of *this*
micro-batch (diagnostics only; they never enter a gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from meg.registry import Registry

PolicyLossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_policy_loss(
    name: str, *, zero_at_zero_advantage: bool = False
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: `@register_policy_loss("grpo")`. `zero_at_zero_advantage`: the loss of a
    sequence whose advantage is 0 is 0 for every parameter value when there is no KL term
    (so its gradient is exactly 0, and zero-advantage skipping is exact for this loss). The
    built-ins' names and flags are also declared torch-free in `catalog.py` for the driver."""
    return POLICY_LOSSES.register(name, zero_at_zero_advantage=zero_at_zero_advantage)


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(πθ ‖ π_ref): exp(d) − d − 1 with d = log π_ref − log πθ.

    Unbiased, always ≥ 0, low variance (Schulman, "Approximating KL divergence"); the form
    used by DeepSeekMath's GRPO and TRL. (B,T), (B,T) → (B,T).
    """
    d = ref_logprobs - logprobs  # (B,T)
    return torch.exp(d) - d - 1.0


LOG_RATIO_CLAMP = 20.0


def truncated_is_weights(anchor: Tensor, behaviour: Tensor, cap: float) -> Tensor:
    """Per-token truncated importance weight min(π_anchor/μ, cap), detached. (B,T) → (B,T).

    Corrects for the gap between the policy the trainer anchors on and the one that sampled
    (numerics, precision, staleness). Truncation bounds the variance; the bias it adds only
    affects tokens the trainer finds > cap times likelier than the sampler did."""
    log_w = (anchor - behaviour).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_w).clamp(max=cap).detach()


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
    dual_clip: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO/GRPO per-token loss: w·(−min(r·A, clip(r, 1−ε, 1+ε_high)·A)) + β·KL_k3(πθ ‖ π_ref).

    `clip_eps_high` (DAPO's "clip-higher") defaults to `clip_eps`. `dual_clip` = c > 1 (Ye et
    al. 2020, "dual-clip PPO") bounds the loss of a negative-advantage token at −c·A however
    large its ratio: a stale token in `async` can no longer make the loss unbounded. `w` is
    `is_weights` (default 1; see `truncated_is_weights`). The KL term needs `ref_logprobs`
    whenever `kl_coef` > 0.
    """
    _check_shapes(logprobs, old_logprobs, advantages, mask)
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B,T)
    ratio = torch.exp(log_ratio)  # (B,T)
    adv = advantages.unsqueeze(1)  # (B,1)
    surr1 = ratio * adv  # (B,T)
    surr2 = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_hi) * adv  # (B,T)
    loss = -torch.min(surr1, surr2)  # (B,T)
    m = mask.to(loss.dtype)
    metrics = {
        "ratio_mean": _masked_mean(ratio.detach(), m),
        "clip_frac": _masked_mean((surr2 < surr1).to(loss.dtype).detach(), m),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (it caps the loss at -c*A), got {dual_clip}")
        cap = (-dual_clip * adv).expand_as(loss)  # (B,T) c·|A| where A < 0
        bind = (adv < 0) & (loss > cap)  # (B,T)
        loss = torch.where(bind, cap, loss)
        metrics["dual_clip_frac"] = _masked_mean(bind.to(m.dtype), m)
    if is_weights is not None:
        loss = loss * is_weights
        metrics["is_weight_mean"] = _masked_mean(is_weights.detach(), m)
    if kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (B,T); pass them or set kl_coef=0")
        kl = k3_kl(logprobs, ref_logprobs)  # (B,T)
        loss = loss + kl_coef * kl
        metrics["kl"] = _masked_mean(kl.detach(), m)
    return loss, metrics


@register_policy_loss("grpo", zero_at_zero_advantage=True)
def grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **kw: object
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO (DeepSeekMath) = the clipped surrogate + k3 KL to a reference, per token.

    With aggregation "seq-mean-token-mean" this is TRL's `loss_type="grpo"`; with "token-mean"
    it is TRL's "bnpo"/DAPO's token-level loss.
    """
    return clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kw)  # type: ignore[arg-type]


@register_policy_loss("dr_grpo", zero_at_zero_advantage=True)
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


# ---- the PPO anchor ----------------------------------------------------------------------
AnchorFn = Callable[[Tensor, Tensor, float, Tensor], tuple[Tensor, Tensor | None]]
ANCHORS: Registry[AnchorFn] = Registry("old-logprobs anchor")


@ANCHORS.register("behaviour")
def _behaviour_anchor(
    logprobs: Tensor, behaviour: Tensor, cap: float, mask: Tensor
) -> tuple[Tensor, None]:
    """Anchor on the sampler's stored logprobs; no separate importance weight."""
    return behaviour, None


@ANCHORS.register("recompute")
def _recompute_anchor(
    logprobs: Tensor, behaviour: Tensor, cap: float, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Anchor on the trainer's own logprobs before the update (= this forward pass, detached:
    one optimizer step per batch), and correct the sampler gap with a truncated IS weight."""
    old = logprobs.detach()
    return old, truncated_is_weights(old, behaviour, cap)


@dataclass(frozen=True, slots=True)
class SparseCorrection:
    """Sparse-RL's correction of rollouts sampled from a compressed KV cache, on the ratio
    ξ_t = π_old(o_t | o_<t) / π_sparse(o_t | M(o_<t)) of the dense old policy to the sparse
    sampler (the values of the paper's released configuration):

    - rejection: a sequence with any token's ξ_t below `reject_below` is dropped whole (the
      sparse sampler wrote a token the dense policy would almost never write: the rest of
      that sequence follows a context the dense policy does not reach);
    - reweighting: a kept token is weighted by ξ_t when ξ_t lies in [`low`, `high`], and
      masked (weight 0) outside it."""

    reject_below: float = 1e-4
    low: float = 0.5
    high: float = 1.5


SPARSE_RL = SparseCorrection()


def sparse_rl_weights(
    anchor: Tensor, behaviour: Tensor, mask: Tensor, c: SparseCorrection = SPARSE_RL
) -> Tensor:
    """Per-token weights (B,T), detached, of `SparseCorrection` `c`, each row one sequence:
    ξ on the kept tokens of kept sequences, 0 elsewhere (and off `mask`)."""
    xi = torch.exp((anchor - behaviour).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B,T)
    on = mask > 0
    rejected = ((xi < c.reject_below) & on).any(dim=-1, keepdim=True)  # (B,1)
    keep = on & (xi >= c.low) & (xi <= c.high) & ~rejected
    return torch.where(keep, xi, torch.zeros_like(xi)).detach()


@ANCHORS.register("sparse_rl")
def _sparse_rl_anchor(
    logprobs: Tensor, behaviour: Tensor, cap: float, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """`recompute`'s dense anchor, with Sparse-RL's rejection and reweighting in place of
    the truncated weight (`cap` is not read: the band's upper end bounds the weight)."""
    old = logprobs.detach()
    return old, sparse_rl_weights(old, behaviour, mask)


def shaped_is_weights(logprobs: Tensor, behaviour: Tensor, gamma: float) -> Tensor:
    """Per-token weights (B,T), detached, that turn the clipped surrogate at ratio 1 into
    LUFFY's shaped off-policy objective −f(x)·A, f(x) = x/(x+γ), x = πθ/μ (the learner's
    probability of the token over the external sampler's):

        ∇f(x) = f'(x)·x·∇log πθ = γ·x/(x+γ)² · ∇log πθ,

    so the weight is γ·x/(x+γ)² (at most 1/4, at x = γ). Against plain importance sampling
    (weight x) it lifts the tokens the learner finds unlikely and damps the ones it already
    writes, which is LUFFY's point: learn what the external policy knows, not copy it. The
    surrogate is the one the trainer already uses: one optimizer step per batch keeps the
    ratio at 1 in value, so no clip binds, as LUFFY's off-policy term has none."""
    x = torch.exp((logprobs.detach() - behaviour).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return (gamma * x / (x + gamma) ** 2).detach()


@ANCHORS.register("external")
def _external_anchor(
    logprobs: Tensor, behaviour: Tensor, cap: float, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """`recompute` on every row; `anchor` replaces the weight of the external rows."""
    old = logprobs.detach()
    return old, truncated_is_weights(old, behaviour, cap)


def anchor(
    name: str,
    logprobs: Tensor,
    behaviour: Tensor,
    cap: float,
    mask: Tensor,
    external: Tensor | None = None,
    gamma: float = 0.1,
) -> tuple[Tensor, Tensor | None]:
    """(old_logprobs (B,T), is_weights (B,T) or None) for anchor `name`; `mask` (B,T): the
    response tokens, one sequence a row; `external` (B,): 1 on the rows an external policy
    sampled, whose weight is `shaped_is_weights` with `gamma` (only the `external` anchor
    takes them: any other would treat them as the agent's own samples)."""
    old, weights = ANCHORS.get(name)(logprobs, behaviour, cap, mask)
    if external is None or not bool(external.any()):
        return old, weights
    if name != "external":
        raise ValueError(
            f"{int(external.sum())} rows of this micro-batch were sampled by an external "
            f"policy, which anchor {name!r} would train as the agent's own: use the "
            "`external` anchor (loss.old_logprobs), which the external rollout policy sets"
        )
    assert weights is not None  # the external anchor is recompute's: it always weighs
    rows = external.to(torch.bool).unsqueeze(1)  # (B,1)
    return old, torch.where(rows, shaped_is_weights(logprobs, behaviour, gamma), weights)
