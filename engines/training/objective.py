"""The per-token objective of one micro-batch under an agent's settings: the PPO anchor
(`losses.anchor`), the registered policy loss with its KL term (`losses.policy_loss`), and
EchoRL's NLL on the clip tokens the driver chose (`echo.py`), and the share of tokens an
external policy wrote (`external_frac`, under the `external` anchor). Aggregation over tokens and
sequences is the trainer's (`aggregate.py`), so every term shares the step's normaliser."""

from __future__ import annotations

import torch
from torch import Tensor

from engines.training.batch import TrainMicroBatch
from engines.training.losses import anchor, policy_loss
from engines.training.train_config import TrainConfig


def token_objective(
    cfg: TrainConfig, logp: Tensor, mb: TrainMicroBatch, ref: Tensor | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss per token (b,T), detached diagnostics) for `logp` = log πθ of `mb`'s tokens
    (b,T); `ref`: the reference logprobs when `cfg.kl_coef` > 0."""
    old, is_weights = anchor(
        cfg.old_logprobs,
        logp,
        mb.old_logprobs,
        cfg.is_cap,
        mb.response_mask,
        mb.external,
        cfg.shaping,
    )
    loss_tok, metrics = policy_loss(
        cfg.policy_loss,
        logp,
        old,
        mb.advantages,
        mb.response_mask,
        clip_eps=cfg.clip_eps,
        clip_eps_high=cfg.clip_eps_high,
        dual_clip=cfg.dual_clip,
        ref_logprobs=ref,
        kl_coef=cfg.kl_coef,
        is_weights=is_weights,
    )
    if mb.echo_mask is not None and cfg.echo_coef:  # EchoRL: NLL on the clip tokens
        loss_tok = loss_tok - cfg.echo_coef * logp * mb.echo_mask
    if cfg.old_logprobs == "external":  # the share of tokens an external policy wrote
        ext = mb.external if mb.external is not None else torch.zeros_like(mb.advantages)
        mask = mb.response_mask.to(logp.dtype)
        metrics["external_frac"] = (mask * ext.unsqueeze(1)).sum() / mask.sum().clamp(min=1.0)
    return loss_tok, metrics


def sample_diagnostics(logp: Tensor, mb: TrainMicroBatch) -> dict[str, float]:
    """Sampled-token estimates, token-averaged over the responses: −log π(token) averages
    to the policy's entropy on its own samples (no full-vocabulary pass), and |A| shows how
    much signal the batch carries."""
    mask = mb.response_mask.to(logp.dtype)
    tokens = float(mask.sum().clamp(min=1))
    return {
        "entropy_mc": float((-logp.detach() * mask).sum()) / tokens,
        "adv_abs_mean": float((mb.advantages.abs().unsqueeze(1) * mask).sum()) / tokens,
    }
