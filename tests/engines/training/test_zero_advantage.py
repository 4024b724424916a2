"""Zero-advantage skipping: the rows with A = 0 are left out of the forward and backward,
and the gradient, the update and the step's counts are those of the unskipped step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engines.training.batch import TrainMicroBatch
from engines.training.losses import clipped_surrogate, register_policy_loss
from engines.training.trainer import AgentTrainer, TrainConfig
from tests.engines.training.training_helpers import merge, random_batch

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def _with_zero(samples: list[TrainMicroBatch], zero: set[int]) -> list[TrainMicroBatch]:
    """The samples, those at `zero` given advantage 0 (a group whose rewards all agreed)."""
    return [
        dataclasses.replace(s, advantages=torch.zeros_like(s.advantages)) if i in zero else s
        for i, s in enumerate(samples)
    ]


def _rows_seen(tr: AgentTrainer) -> list[int]:
    """Batch sizes the model's forward passes get (a hook on the input embeddings)."""
    seen: list[int] = []
    tr.model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: seen.append(int(args[0].shape[0]))
    )
    return seen


def _pair(tiny_model: str, **kw: object) -> tuple[AgentTrainer, AgentTrainer]:
    base = TrainConfig(lr=1e-3, **kw)  # type: ignore[arg-type]
    skip = dataclasses.replace(base, skip_zero_advantage=True)
    return AgentTrainer("a", tiny_model, base), AgentTrainer("a", tiny_model, skip)


@pytest.mark.parametrize("streaming", [False, True], ids=["declared", "streaming"])
@pytest.mark.parametrize("mode", MODES)
def test_skipping_gives_the_unskipped_gradient(tiny_model: str, mode: str, streaming: bool) -> None:
    plain, skipping = _pair(tiny_model, aggregation=mode)
    seen = _rows_seen(skipping)
    for step in range(2):
        samples = _with_zero(random_batch(seed=40 + step, n=8), {0, 1, 2, 3, 6})
        parts = [merge(samples[:4]), merge(samples[4:])]  # the first: zero advantages only
        full = merge(samples)
        for tr in (plain, skipping):
            tr.begin_step() if streaming else tr.begin_step(full.num_tokens, full.num_seqs)
            for j, mb in enumerate(parts):
                tr.accumulate(mb, part=j)
        g_plain = {n: p.grad.clone() for n, p in plain.model.named_parameters()}
        for n, p in skipping.model.named_parameters():
            torch.testing.assert_close(p.grad, g_plain[n], rtol=1e-5, atol=1e-7)
        r_plain, r_skip = plain.step(), skipping.step()
        assert r_skip.parts == r_plain.parts  # the counts still hold every row
        assert (r_skip.num_tokens, r_skip.num_seqs) == (full.num_tokens, 8)
        assert r_skip.loss == pytest.approx(r_plain.loss, rel=1e-5, abs=1e-7)
        assert r_skip.metrics["zero_adv_skipped_frac"] == pytest.approx(5 / 8)
        assert "zero_adv_skipped_frac" not in r_plain.metrics
    assert seen == [3, 3]  # per step: the all-zero part never reached the model; 3 of 4 did
    w_plain, w_skip = plain.weights(), skipping.weights()
    for k in w_plain:
        torch.testing.assert_close(w_skip[k], w_plain[k], rtol=1e-5, atol=1e-6)


def test_a_step_of_only_zero_advantages_still_moves_adams_moments(tiny_model: str) -> None:
    """No row is back-propagated, yet AdamW steps on zero gradients as the unskipped
    trainer does (its momentum from the step before keeps moving the weights)."""
    plain, skipping = _pair(tiny_model)
    seen = _rows_seen(skipping)
    first = merge(random_batch(seed=5, n=4))
    zeros = merge(_with_zero(random_batch(seed=6, n=4), {0, 1, 2, 3}))
    for tr in (plain, skipping):
        for mb in (first, zeros):
            tr.begin_step()
            tr.accumulate(mb, part=0)
            result = tr.step()
    assert result.metrics["zero_adv_skipped_frac"] == 1.0 and result.version == 2
    assert seen == [4]  # only the first step's forward
    w_plain, w_skip = plain.weights(), skipping.weights()
    before = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-3)).weights()
    assert any(not torch.equal(w_plain[k], before[k]) for k in w_plain)
    for k in w_plain:
        torch.testing.assert_close(w_skip[k], w_plain[k], rtol=1e-5, atol=1e-6)


@register_policy_loss("test_surrogate_plus_length")
def _surrogate_plus_length(logprobs, old_logprobs, advantages, mask, **kw):  # type: ignore[no-untyped-def]
    """A loss with a term that does not vanish at A = 0 (it does not declare the property)."""
    loss, metrics = clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kw)
    return loss - 0.01 * logprobs, metrics


@pytest.mark.parametrize(
    "kw", [{"kl_coef": 0.1}, {"policy_loss": "test_surrogate_plus_length"}], ids=["kl", "loss"]
)
def test_no_skipping_where_a_zero_advantage_row_has_a_gradient(
    tiny_model: str, kw: dict[str, object]
) -> None:
    """With a KL term, or a policy loss not declared zero at A = 0, every row is trained."""
    plain, skipping = _pair(tiny_model, **kw)
    seen = _rows_seen(skipping)
    mb = merge(_with_zero(random_batch(seed=9, n=4), {0, 1}))
    for tr in (plain, skipping):
        tr.begin_step()
        tr.accumulate(mb, part=0)
    grads = {n: p.grad.clone() for n, p in plain.model.named_parameters()}
    for n, p in skipping.model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n])
    assert "zero_adv_skipped_frac" not in skipping.step().metrics
    assert 4 in seen  # the whole micro-batch was forwarded


def test_the_meg_field_reaches_the_trainer() -> None:
    from meg.spec import AgentSpec

    agent = AgentSpec.model_validate({"model": "m", "loss": {"skip_zero_advantage": True}})
    assert TrainConfig.from_agent(agent).skip_zero_advantage
    assert not TrainConfig.from_agent(AgentSpec.model_validate({"model": "m"})).skip_zero_advantage


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        ({"kl_coef": 0.1}, "needs kl_coef 0"),
        ({"policy_loss": "test_surrogate_plus_length"}, "is not registered as zero"),
    ],
)
def test_validation_refuses_skipping_where_it_would_not_apply(
    tmp_path: Path, loss: dict[str, object], message: str
) -> None:
    import yaml

    from flows.runs.config import load_config
    from meg import MEGError
    from workloads import BUILTIN

    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    data["agents"]["solver"]["loss"] = {"skip_zero_advantage": True, **loss}
    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(MEGError, match=message) as err:
        load_config(str(cfg), check_models=False)
    assert err.value.field == "agents.solver.loss.skip_zero_advantage"
    data["agents"]["solver"]["loss"] = {"skip_zero_advantage": True}
    cfg.write_text(yaml.safe_dump(data))
    assert load_config(str(cfg), check_models=False).agents["solver"].loss.skip_zero_advantage
