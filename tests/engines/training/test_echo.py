"""EchoRL (`loss.echo`): which tokens get the auxiliary NLL term (`engines/training/echo.py`,
pure) and what the trainer does with them: an all-success group, whose advantages are all 0,
now has a gradient, exactly `coef` × the clip tokens' NLL under the aggregation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from engines.training.aggregate import aggregate
from engines.training.batch import build_microbatch, token_logprobs
from engines.training.echo import echo_clips, peak_step, step_ends
from engines.training.trainer import AgentTrainer, TrainConfig
from meg.agent_spec import AgentSpec, EchoSpec


def test_steps_end_after_each_delimiter_and_at_the_end() -> None:
    d = np.array([0, 1, 0, 0, 1, 0], bool)
    assert step_ends(d).tolist() == [2, 5, 6]
    assert step_ends(np.array([0, 1], bool)).tolist() == [2]  # no empty last step
    assert step_ends(np.zeros(0, bool)).tolist() == []


def test_the_clip_ends_with_the_step_of_highest_mean_surprisal() -> None:
    surprisal = np.array([0.1, 0.1, 3.0, 1.0, 0.2, 0.2])  # steps [0,2) [2,4) [4,6)
    delim = np.array([0, 1, 0, 1, 0, 0], bool)
    assert peak_step(surprisal, delim) == (4, pytest.approx(2.0))
    assert peak_step(surprisal, np.zeros(6, bool))[0] == 6  # one step: the whole response


def _clips(rewards: list[float], adv: list[float], groups: list[str]) -> list[int]:
    surprisal = [np.array([0.5, 2.0 + i, 0.1]) for i in range(len(groups))]
    delim = [np.array([0, 1, 0], bool)] * len(groups)
    return echo_clips(groups, np.array(rewards), np.array(adv), surprisal, delim, 1.0).tolist()


def test_only_all_success_zero_advantage_groups_echo_once() -> None:
    groups = ["a", "a", "b", "b", "c", "c"]
    rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    adv = [0.0, 0.0, 0.7, -0.7, 0.0, 0.0]
    # a: both succeed, the second's peak is higher; b: mixed (the policy loss's); c: same
    assert _clips(rewards, adv, groups) == [0, 2, 0, 0, 0, 2]
    # a failed reward (NaN) or one below the bar disqualifies the group
    assert _clips([1.0, float("nan")], [0.0, 0.0], ["a", "a"]) == [0, 0]
    assert _clips([0.0, 0.0], [0.0, 0.0], ["a", "a"]) == [0, 0]  # all failed: nothing to echo


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.sampled_from([0.0, 1.0]),
            st.lists(st.floats(0, 10), min_size=0, max_size=8),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_clips_are_prefixes_ending_a_step_one_per_qualifying_group(rows: list) -> None:
    groups = [g for g, _, _, _ in rows]
    rewards = np.array([r for _, r, _, _ in rows])
    surprisal = [np.array(s) for _, _, s, _ in rows]
    delim = [np.array([(bits >> i) & 1 for i in range(len(s))], bool) for _, _, s, bits in rows]
    clips = echo_clips(groups, rewards, np.zeros(len(rows)), surprisal, delim, 1.0)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        qualifies = all(rewards[i] >= 1.0 for i in idx) and any(len(surprisal[i]) for i in idx)
        assert sum(clips[i] > 0 for i in idx) == (1 if qualifies else 0)
    for i, c in enumerate(clips):
        assert 0 <= c <= len(surprisal[i])
        if c:
            assert c == len(surprisal[i]) or delim[i][c - 1]  # ends a step


def test_the_meg_field_reaches_the_trainer_and_misspellings_name_themselves() -> None:
    agent = AgentSpec.model_validate({"model": "m", "loss": {"echo": {"coef": 0.05}}})
    assert TrainConfig.from_agent(agent).echo_coef == 0.05
    default = AgentSpec.model_validate({"model": "m", "loss": {"echo": True}})
    assert default.loss.echo == EchoSpec() and default.loss.echo.coef == 0.001
    assert TrainConfig.from_agent(AgentSpec.model_validate({"model": "m"})).echo_coef == 0.0
    with pytest.raises(ValidationError, match=r"echo\.coeff"):
        AgentSpec.model_validate({"model": "m", "loss": {"echo": {"coeff": 0.1}}})
    with pytest.raises(ValidationError, match=r"echo\.delimiter"):
        AgentSpec.model_validate({"model": "m", "loss": {"echo": {"delimiter": ""}}})


def _batch(echo: list[int]) -> object:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 64, (4,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(3, 64, (6,), generator=g).tolist() for _ in range(4)]
    old = [[-3.0] * 6 for _ in range(4)]
    return build_microbatch(prompts, responses, old, [0.0] * 4, 0, echo_lengths=echo)


@pytest.mark.parametrize("skip", [False, True], ids=["all-rows", "skip-zero-adv"])
def test_an_all_success_group_trains_on_its_clip_only(tiny_model: str, skip: bool) -> None:
    """Advantages all 0: without echo the gradient is exactly 0; with it, it is coef × the
    gradient of the clip tokens' NLL under token-mean (the normaliser counts every response
    token), also when zero-advantage skipping leaves the other rows out."""
    mb = _batch([0, 3, 0, 0])
    coef = 0.5
    cfg = TrainConfig(lr=1e-3, echo_coef=coef, skip_zero_advantage=skip)
    echo = AgentTrainer("a", tiny_model, cfg)
    plain = AgentTrainer("a", tiny_model, dataclasses.replace(cfg, echo_coef=0.0))
    for tr in (echo, plain):
        tr.begin_step(mb.num_tokens, mb.num_seqs)
        tr.accumulate(mb, part=0)
    assert all(p.grad is None or not p.grad.any() for p in plain.model.parameters())
    ref = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-3))
    logp = token_logprobs(ref.model, mb.input_ids, mb.attention_mask, mb.response_mask)
    nll = aggregate(
        -coef * logp * mb.echo_mask,
        mb.response_mask,
        "token-mean",
        global_tokens=mb.num_tokens,
        global_seqs=mb.num_seqs,
    )
    nll.backward()
    want = {n: p.grad for n, p in ref.model.named_parameters()}
    for n, p in echo.model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-7)
    result = echo.step()
    assert result.metrics["echo_frac"] == pytest.approx(3 / 24)
    if skip:
        assert result.metrics["zero_adv_skipped_frac"] == pytest.approx(3 / 4)


def test_a_clip_longer_than_its_response_is_refused() -> None:
    with pytest.raises(ValueError, match="sample 1: echo clip of 7 tokens"):
        _batch([0, 7, 0, 0])
