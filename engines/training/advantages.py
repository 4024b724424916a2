"""Group advantage estimators: rewards in, one advantage per sample out.

A *group* is the `n` samples of one prompt (one MEG node invocation). Groups
are given by index, not by a (P, G) reshape, because in a multi-agent episode groups differ
in size (a child node that runs once per parent sample, a truncated episode, a dropped
sample). All estimators here are segment reductions over `group_index` with scatter ops.

Every estimator has the signature `(rewards (N,), group_index (N,) long, **kw) -> (N,)`
and is registered by name; `compute_advantages(name, ...)` is the only entry point callers
need. A group of one sample has no baseline to compare against: GRPO and RLOO give it
advantage 0 (no learning signal) rather than NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from meg.registry import Registry

AdvantageFn = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: `@register_advantage("grpo")`."""
    return ADVANTAGES.register(name)


def _check(rewards: Tensor, group_index: Tensor) -> None:
    if rewards.ndim != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be 1-D of equal length; got "
            f"{tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    if group_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"group_index must be an integer tensor, got {group_index.dtype}")


def _group_stats(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group size, group mean, group sum of squared deviations), each (N,).

    Group ids may be any integers; they are compacted with `unique(return_inverse=True)`.
    """
    _, inv = torch.unique(group_index, return_inverse=True)  # (N,) in [0, G)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    r = rewards.to(torch.float64)  # reductions in float64: exact enough for tests and users
    count = torch.zeros(g, dtype=r.dtype, device=r.device).scatter_add_(
        0, inv, torch.ones_like(r)
    )  # (G,)
    mean = torch.zeros(g, dtype=r.dtype, device=r.device).scatter_add_(0, inv, r) / count  # (G,)
    dev = r - mean[inv]  # (N,)
    ssd = torch.zeros(g, dtype=r.dtype, device=r.device).scatter_add_(0, inv, dev * dev)  # (G,)
    return count[inv], mean[inv], ssd[inv]


@register_advantage("grpo")
def grpo(rewards: Tensor, group_index: Tensor, *, eps: float = 1e-6) -> Tensor:
    """A_i = (r_i − mean_g) / (std_g + eps), std with Bessel's correction (as TRL and verl).

    Singleton groups → 0. A group with equal rewards → 0 (deviation is 0, eps avoids 0/0).
    """
    _check(rewards, group_index)
    n, mean, ssd = _group_stats(rewards, group_index)  # (N,) each
    std = torch.sqrt(ssd / (n - 1).clamp(min=1))  # (N,)
    adv = (rewards.to(mean.dtype) - mean) / (std + eps)  # (N,)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(rewards.dtype)


@register_advantage("grpo_no_std")
def grpo_no_std(rewards: Tensor, group_index: Tensor) -> Tensor:
    """A_i = r_i − mean_g (Dr.GRPO: dividing by the std biases towards easy/hard prompts)."""
    _check(rewards, group_index)
    _, mean, _ = _group_stats(rewards, group_index)
    return (rewards.to(mean.dtype) - mean).to(rewards.dtype)  # (N,)


@register_advantage("rloo")
def rloo(rewards: Tensor, group_index: Tensor) -> Tensor:
    """Leave-one-out baseline: A_i = r_i − mean_{j≠i} r_j = n/(n−1)·(r_i − mean_g).

    Singleton groups → 0 (there is no "other" sample).
    """
    _check(rewards, group_index)
    n, mean, _ = _group_stats(rewards, group_index)
    adv = n / (n - 1).clamp(min=1) * (rewards.to(mean.dtype) - mean)  # (N,)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(rewards.dtype)


@register_advantage("maxrl")
def maxrl(rewards: Tensor, group_index: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Centered Maximum-Likelihood RL: A_i = (r_i − mean_g) / (mean_g + eps).

    With 0/1 rewards, mean_g estimates the prompt's success rate p, and the group's gradient
    estimates that of log p rather than of p (GRPO's std rescales by sqrt(p(1-p))): a hard
    prompt's rare success weighs 1/p. SERA sizes groups for this estimator. A group with no
    success (mean 0) or one reward → 0.
    """
    _check(rewards, group_index)
    n, mean, _ = _group_stats(rewards, group_index)
    adv = (rewards.to(mean.dtype) - mean) / (mean.abs() + eps)  # (N,)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(rewards.dtype)


@register_advantage("reinforce")
def reinforce(rewards: Tensor, group_index: Tensor) -> Tensor:
    """Plain REINFORCE with one batch-mean baseline: A_i = r_i − mean(r). Groups are ignored."""
    _check(rewards, group_index)
    r = rewards.to(torch.float64)
    return (r - r.mean()).to(rewards.dtype) if r.numel() else rewards.clone()  # (N,)


def compute_advantages(name: str, rewards: Tensor, group_index: Tensor, **kw: float) -> Tensor:
    """Look up estimator `name` and apply it: (N,), (N,) → (N,)."""
    return ADVANTAGES.get(name)(rewards, group_index, **kw)
