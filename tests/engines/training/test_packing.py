"""Padding-free training (`optim.packing: by_length`) is the padded path's training, exactly:
the same loss, every parameter's gradient, the gradient norm and the step's metrics, to
fp32 tolerance, on every model family the project supports, under LoRA and in bfloat16;
its grouping is a pure function of the lengths; a misspelt setting is refused by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from engines.training.batch import TrainMicroBatch, build_microbatch
from engines.training.lora import LoraConfig
from engines.training.packing import length_groups, padding_share, scored_lengths
from engines.training.trainer import AgentTrainer, TrainConfig
from meg import MEGError, load_meg
from workloads.family_configs import FAMILIES
from workloads.tiny_model import build_tiny_model

VOCAB = 512
FP32 = {"rtol": 1e-5, "atol": 1e-6}
# bf16 matmuls round each product to 8 bits of mantissa: grouped and padded batches sum in
# other orders, so they agree to bf16's resolution (torch's own bf16 rtol is 1.6e-2)
BF16 = {"rtol": 2e-2, "atol": 2e-3}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp(request.param) / "model"
    return str(build_tiny_model(path, family=request.param, vocab=VOCAB, seed=0))


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("llama") / "model", vocab=VOCAB))


def micro_batch(lengths: list[tuple[int, int]], seed: int) -> TrainMicroBatch:
    """Rows of (prompt, response) lengths: random tokens, behaviour logprobs off the
    policy's (so ratios, clipping and the importance weight are not trivial)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, VOCAB, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(3, VOCAB, (r,), generator=g).tolist() for _, r in lengths]
    old = [(-torch.rand(r, generator=g) * 3 - 5).tolist() for _, r in lengths]
    adv = torch.randn(len(lengths), generator=g).tolist()
    return build_microbatch(prompts, responses, old, adv, pad_id=0)


# heavy-tailed like the longtail workload, with an empty response in the first one
LONGTAIL = [
    micro_batch([(9, 3), (11, 41), (8, 0), (10, 4), (12, 5), (9, 12), (10, 2), (13, 27)], 1),
    micro_batch([(10, 4), (9, 6), (11, 3), (12, 18), (8, 4)], 2),
]


def train_step(
    tr: AgentTrainer, mbs: list[TrainMicroBatch], packing: str, streaming: bool
) -> dict[str, Any]:
    """One step of `mbs` under `packing` from the trainer's current state (restored after):
    each micro-batch's returned metrics, every gradient before the step, the step's result
    and the updated weights."""
    saved = {k: v.clone() for k, v in tr.state().items()}
    meta = tr.meta()
    tr.config = replace(tr.config, packing=packing)
    tokens, seqs = sum(m.num_tokens for m in mbs), sum(m.num_seqs for m in mbs)
    tr.begin_step(*((None, None) if streaming else (tokens, seqs)))
    per_mb = [tr.accumulate(mb, part=j) for j, mb in enumerate(mbs)]
    grads = {n: None if p.grad is None else p.grad.clone() for p, n in tr._names.items()}
    result = tr.step()
    weights = {n: p.detach().clone() for p, n in tr._names.items()}
    tr.load_state(saved, meta)
    return {"per_mb": per_mb, "grads": grads, "result": result, "weights": weights}


def assert_same_training(a: dict[str, Any], b: dict[str, Any], tol: dict[str, float]) -> None:
    for ma, mb in zip(a["per_mb"], b["per_mb"], strict=True):
        assert ma.keys() == mb.keys()
        for k in ma:
            torch.testing.assert_close(mb[k], ma[k], **tol, msg=k)
    assert a["grads"].keys() == b["grads"].keys()
    assert any(g is not None for g in a["grads"].values())
    for n, g in a["grads"].items():
        if g is None:
            assert b["grads"][n] is None, n
        else:
            torch.testing.assert_close(b["grads"][n], g, **tol, msg=n)
    ra, rb = a["result"], b["result"]
    assert (ra.version, ra.skipped, ra.num_tokens, ra.num_seqs, ra.parts) == (
        rb.version,
        rb.skipped,
        rb.num_tokens,
        rb.num_seqs,
        rb.parts,
    )
    torch.testing.assert_close(rb.loss, ra.loss, **tol)
    torch.testing.assert_close(rb.grad_norm, ra.grad_norm, **tol)
    assert ra.metrics.keys() == rb.metrics.keys()
    for k in ra.metrics:
        torch.testing.assert_close(rb.metrics[k], ra.metrics[k], **tol, msg=k)
    # (not the updated weights: AdamW's first step is lr·g/(|g| + ε), so an entry whose
    # gradient is at the fp32 noise floor of a sum moves by ±lr either way)


# every loss path: the behaviour anchor with dual clip and KL (reference logprobs from the
# initial policy), and the recompute anchor's importance weight under sequence-mean
CONFIGS = {
    "token-mean-kl": TrainConfig(
        lr=1e-3, old_logprobs="behaviour", kl_coef=0.05, dual_clip=3.0, clip_eps=0.1
    ),
    "seq-mean-recompute": TrainConfig(lr=1e-3, aggregation="seq-mean-token-mean", is_cap=1.5),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_family_trains_the_same_step_grouped_as_padded(
    family_model: str, config: str
) -> None:
    tr = AgentTrainer("a", family_model, CONFIGS[config])
    streaming = config == "token-mean-kl"  # normalised at step() (the orchestrator's way)
    padded = train_step(tr, LONGTAIL, "none", streaming)
    grouped = train_step(tr, LONGTAIL, "by_length", streaming)
    assert_same_training(padded, grouped, FP32)


def test_lora_adapters_train_the_same_step(llama_model: str) -> None:
    lora = LoraConfig(r=4, alpha=8.0, target_modules="all-linear")
    tr = AgentTrainer("a", llama_model, TrainConfig(lr=1e-2, kl_coef=0.05, lora=lora))
    first = train_step(tr, LONGTAIL, "none", streaming=False)  # B = 0: move it off zero
    tr.policy.assign({n: w for n, w in first["weights"].items()})
    padded = train_step(tr, LONGTAIL, "none", streaming=False)
    grouped = train_step(tr, LONGTAIL, "by_length", streaming=False)
    assert all(".lora_" in n for n in padded["grads"])
    assert_same_training(padded, grouped, FP32)


def test_bfloat16_trains_the_same_step_to_bf16_resolution(llama_model: str) -> None:
    tr = AgentTrainer("a", llama_model, TrainConfig(lr=1e-3, dtype="bfloat16"))
    padded = train_step(tr, LONGTAIL, "none", streaming=False)
    grouped = train_step(tr, LONGTAIL, "by_length", streaming=False)
    assert_same_training(padded, grouped, BF16)


@pytest.mark.parametrize(
    "rows",
    [
        [(7, 5)],  # one row
        [(6, 4), (6, 4), (6, 4)],  # equal lengths: one group, no padding either way
        [(5, 0), (6, 9), (4, 1)],  # a row without response tokens
    ],
    ids=["one-row", "equal-lengths", "empty-response"],
)
def test_edge_cases_train_the_same(llama_model: str, rows: list[tuple[int, int]]) -> None:
    tr = AgentTrainer("a", llama_model, TrainConfig(lr=1e-3, kl_coef=0.05))
    mbs = [micro_batch(rows, 3)]
    assert_same_training(
        train_step(tr, mbs, "none", streaming=False),
        train_step(tr, mbs, "by_length", streaming=False),
        FP32,
    )


def test_a_micro_batch_of_empty_responses_has_no_gradient_either_way(llama_model: str) -> None:
    tr = AgentTrainer("a", llama_model, TrainConfig(lr=1e-3))
    mb = micro_batch([(5, 0), (7, 0)], 4)
    for packing in ("none", "by_length"):
        tr.config = replace(tr.config, packing=packing)
        tr.begin_step(None, None)
        assert tr.accumulate(mb, part=0)["loss"] == 0.0
        assert all(p.grad is None for p in tr._names), packing


def test_length_groups_are_a_partition_decided_by_the_lengths() -> None:
    lengths = [12, 0, 50, 13, 12, 48, 14, 3]
    groups = length_groups(lengths, group_cost=64)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == [0, 2, 3, 4, 5, 6, 7]  # every row with a token, once; not row 1
    assert [lengths[i] for i in flat] == sorted(lengths[i] for i in flat)  # by length
    assert length_groups(lengths, group_cost=64) == groups  # deterministic
    assert len(length_groups(lengths, group_cost=10**6)) == 1  # a pass costs more than padding
    free = length_groups(lengths, group_cost=0)  # passes are free: no padding at all
    assert padding_share(lengths, free) == 0.0
    assert padding_share(lengths, groups) < padding_share(lengths, [flat])
    assert length_groups([0, 0]) == ()
    with pytest.raises(ValueError, match="group_cost"):
        length_groups([1], group_cost=-1)


def test_scored_lengths_end_at_the_last_response_token() -> None:
    mb = micro_batch([(3, 2), (5, 0), (1, 6)], 5)
    assert scored_lengths(mb.response_mask) == [5, 0, 7]


def test_a_misspelt_packing_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="packing 'bylength' unknown; known: none, by_length"):
        TrainConfig(packing="bylength")
    path = tmp_path / "meg.yaml"
    meg = {
        "name": "t",
        "agents": {"a": {"model": "hf://o/m", "optim": {"packing": "bylength"}}},
        "nodes": {"x": {"agent": "a", "template": "hi"}},
    }
    path.write_text(yaml.safe_dump(meg))
    with pytest.raises(MEGError) as ei:
        load_meg(path)
    assert "agents.a.optim.packing" in str(ei.value) and "by_length" in str(ei.value)
