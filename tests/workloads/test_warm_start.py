"""The warm start teaches each node's format with the rollout's own prompt token ids."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engines.tokenizers import chat_frame_of
from flows.cli.commands import load_config
from meg.spec import ChatSpec
from meg.template import prompt_ids, render_ids
from workloads.datasets import TaskItem
from workloads.tiny_model import build_tiny_model, load_tokenizer
from workloads.warm_start import _encode, reference_pairs, warm_start


@pytest.mark.parametrize("workload", ["math-chain", "debate", "fanout"])
def test_reference_episode_covers_every_node(workload: str) -> None:
    spec = load_config(workload, check_models=False)
    pairs = reference_pairs(spec, TaskItem("t", "3+4", "7"), random.Random(0))
    assert len(pairs) == len(spec.nodes)
    for ex in pairs:
        assert ex.completion.strip() in ("7", "yes", "no")
        assert "{" not in ex.prompt  # every placeholder rendered


def test_prompts_are_encoded_exactly_like_the_rollout(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", vocab=300)
    tok = load_tokenizer(model)
    spec = load_config("math-chain", check_models=False)
    ex = reference_pairs(spec, TaskItem("t", "3+4", "7"), random.Random(1))[1]  # the verifier
    ids, mask = _encode(tok, [ex])

    def enc(t: str) -> list[int]:
        return list(tok(t, add_special_tokens=False)["input_ids"])

    expected = render_ids(
        ex.template,
        ex.question,
        {k: [enc(v)] for k, v in ex.parents.items()},
        enc,
        eos_id=tok.eos_token_id,
        newline_ids=enc("\n"),
    )
    n_prompt = int((mask[0] == 0).sum())
    assert ids[0, :n_prompt].tolist() == expected


def test_chat_nodes_are_taught_inside_the_rollouts_chat_frame(tmp_path: Path) -> None:
    """A `chat:` node's examples carry the same framing ids the rollout puts around them."""
    model = build_tiny_model(tmp_path / "m", vocab=300)
    tok = load_tokenizer(model)
    spec = load_config("math-chain", check_models=False)
    solver = next(iter(spec.nodes))
    node = spec.nodes[solver].model_copy(update={"chat": ChatSpec(system="Be brief.")})
    spec = spec.model_copy(update={"nodes": {**spec.nodes, solver: node}})
    ex = reference_pairs(spec, TaskItem("t", "3+4", "7"), random.Random(1))[0]
    assert ex.chat == node.chat
    ids, mask = _encode(tok, [ex])

    def enc(t: str) -> list[int]:
        return list(tok(t, add_special_tokens=False)["input_ids"])

    frame = chat_frame_of(node, str(model))
    assert frame is not None and frame[0] and frame[1]
    expected = prompt_ids(
        ex.template, frame, ex.question, {}, enc, eos_id=tok.eos_token_id, newline_ids=enc("\n")
    )
    n_prompt = int((mask[0] == 0).sum())
    assert ids[0, :n_prompt].tolist() == expected


def test_warm_start_lowers_the_loss(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", vocab=300)
    report = warm_start(model, load_config("math-chain", check_models=False), steps=8, batch=16)
    assert report.steps == 8 and report.loss_last < report.loss_first
    assert 0.0 <= report.token_accuracy <= 1.0
    assert "warm start: 8 steps" in report.summary()
