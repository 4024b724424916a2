"""Advantage estimators against plain Python reference loops on random ragged groups."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from engines.training.advantages import ADVANTAGES, compute_advantages


def _groups(rewards: list[float], idx: list[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r, g in zip(rewards, idx, strict=True):
        out.setdefault(g, []).append(r)
    return out


def ref_loop(name: str, rewards: list[float], idx: list[int]) -> list[float]:
    groups = _groups(rewards, idx)
    out = []
    for r, g in zip(rewards, idx, strict=True):
        rs = groups[g]
        n, mean = len(rs), sum(rs) / len(rs)
        if name == "grpo":
            out.append(0.0 if n == 1 else (r - mean) / (statistics.stdev(rs) + 1e-6))
        elif name == "grpo_no_std":
            out.append(r - mean)
        elif name == "rloo":
            out.append(0.0 if n == 1 else r - (sum(rs) - r) / (n - 1))
        elif name == "reinforce":
            out.append(r - sum(rewards) / len(rewards))
        elif name == "maxrl":
            out.append(0.0 if n == 1 else (r - mean) / (abs(mean) + 1e-6))
    return out


def _random_case(seed: int, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 7, (n_groups,), generator=g)  # ragged, incl. singletons
    ids = torch.randperm(1000, generator=g)[:n_groups]  # arbitrary, non-contiguous ids
    idx = torch.repeat_interleave(ids, sizes)
    idx = idx[torch.randperm(idx.numel(), generator=g)]  # groups interleaved
    rewards = torch.randn(idx.numel(), generator=g, dtype=torch.float64)
    return rewards, idx


@pytest.mark.parametrize("name", ["grpo", "grpo_no_std", "rloo", "reinforce", "maxrl"])
@pytest.mark.parametrize(("seed", "n_groups"), [(0, 1), (1, 5), (2, 17), (3, 40)])
def test_matches_reference_loop(name: str, seed: int, n_groups: int) -> None:
    rewards, idx = _random_case(seed, n_groups)
    got = compute_advantages(name, rewards, idx)
    want = ref_loop(name, rewards.tolist(), idx.tolist())
    assert got.shape == rewards.shape
    for a, b in zip(got.tolist(), want, strict=True):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_singletons_and_equal_rewards_give_zero() -> None:
    rewards = torch.tensor([1.0, 3.0, 3.0, 3.0])
    idx = torch.tensor([7, 9, 9, 9])
    for name in ("grpo", "rloo", "grpo_no_std"):
        assert compute_advantages(name, rewards, idx).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_maxrl_weighs_a_hard_prompts_rare_success_by_one_over_its_rate() -> None:
    """0/1 rewards: a success in a group of success rate p gets (1 - p)/p, a failure -1; a
    group with no success teaches nothing (GRPO would give it 0 too)."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    idx = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])
    got = compute_advantages("maxrl", rewards, idx).tolist()
    want = [3.0, -1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(got, want, strict=True))


def test_float32_in_float32_out() -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float32)
    adv = compute_advantages("grpo", rewards, torch.tensor([0, 0, 1, 1]))
    assert adv.dtype == torch.float32
    assert adv[0] < 0 < adv[1]


def test_unknown_name_lists_known() -> None:
    with pytest.raises(KeyError, match="known: grpo, grpo_no_std, maxrl, reinforce, rloo"):
        compute_advantages("ppo", torch.zeros(2), torch.zeros(2, dtype=torch.long))
    assert set(ADVANTAGES.names()) >= {"grpo", "rloo"}


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="1-D of equal length"):
        compute_advantages("grpo", torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        compute_advantages("grpo", torch.zeros(2), torch.zeros(2))
