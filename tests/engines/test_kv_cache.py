"""A CPU vLLM engine's KV cache is sized from the run (`engines.kv_cache`): the bytes a
token takes are the ones vLLM itself allocates, per family; a call's rows and blocks follow
the MEG; the size stays between the floor and the memory share."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from engines.devices import CPU_KV_CACHE_BYTES
from engines.kv_cache import (
    BLOCK_TOKENS,
    KV_RAM_SHARE,
    MAX_NUM_SEQS,
    call_blocks,
    kv_bytes_per_token,
    kv_cache_bytes,
)
from engines.rollout.base import make_backend
from meg.analysis import longest_rows
from meg.load import load_meg
from meg.spec import MEGSpec
from workloads import BUILTIN
from workloads.tiny_model import build_tiny_model

GIB = 1 << 30


def spec_of(doc: dict[str, Any], tmp_path: Path) -> MEGSpec:
    path = tmp_path / "meg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_meg(path, check_models=False)


def one_node(tmp_path: Path, *, max_tokens: int, n: int, episodes: int, mbs: int) -> MEGSpec:
    """One agent, one node whose template is the question alone (no text of its own)."""
    return spec_of(
        {
            "name": "one",
            "agents": {"a": {"model": "m", "sampling": {"max_tokens": max_tokens}}},
            "nodes": {"solve": {"agent": "a", "template": "{question}", "n": n}},
            "rewards": {"solve": {"fn": "exact_answer"}},
            "run": {"episodes_per_step": episodes, "micro_batches": mbs},
        },
        tmp_path,
    )


@pytest.mark.parametrize(
    ("family", "sizes"),
    [
        ("llama", {}),
        ("qwen2", {"vocab": 512, "heads": 4}),
        ("gpt2", {}),
    ],
)
def test_bytes_per_token_are_what_vllm_allocates(
    tmp_path: Path, family: str, sizes: dict[str, Any]
) -> None:
    """An engine given B bytes holds B / (our bytes a token) tokens, rounded down to whole
    blocks of `BLOCK_TOKENS`: vLLM's own count, per family (GPT-2's config names differ)."""
    model = build_tiny_model(tmp_path / family, family=family, **sizes)
    per_token = kv_bytes_per_token(json.loads((model / "config.json").read_text()), "float32")
    engine: Any = make_backend("vllm", model, kv_cache_bytes=40 << 20)
    try:
        cache = engine.llm.llm_engine.vllm_config.cache_config
        assert cache.block_size == BLOCK_TOKENS
        assert cache.num_gpu_blocks == (40 << 20) // per_token // BLOCK_TOKENS
    finally:
        engine.close()


def test_a_config_without_the_fields_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="layer count"):
        kv_bytes_per_token({"hidden_size": 8}, "float32")
    assert kv_bytes_per_token(
        {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
         "hidden_size": 256, "head_dim": 64}, "bfloat16"
    ) == 2 * 2 * 2 * 64 * 2  # fmt: skip


def test_a_call_holds_one_micro_batch_of_rows_each_in_whole_blocks(tmp_path: Path) -> None:
    spec = one_node(tmp_path, max_tokens=300, n=4, episodes=32, mbs=2)
    samples, tokens = longest_rows(spec)["solve"]
    assert (samples, tokens) == (4, spec.dataset.question_tokens + 300)
    # 16 episodes a micro-batch × 4 samples, each row 316 tokens: 3 blocks of 128
    assert call_blocks(spec, ("a",), context=2048) == 64 * 3
    assert call_blocks(spec, ("a",), context=200) == 64 * 2  # a row stops at the context
    assert call_blocks(spec, ("nobody",), context=2048) == 0
    big = one_node(tmp_path, max_tokens=300, n=16, episodes=256, mbs=2)
    assert call_blocks(big, ("a",), 2048) == MAX_NUM_SEQS * 3  # vLLM runs 256 rows at once


def test_the_largest_node_of_a_fanout_decides(tmp_path: Path) -> None:
    """fanout: `long` decodes 64 tokens for 2 samples of each of 2 plans an episode; the
    aggregator shows every worker's answer. Per agent, its own nodes count."""
    spec = load_meg(BUILTIN["fanout"], check_models=False)
    rows = longest_rows(spec)
    episodes = math.ceil(spec.run.episodes_per_step / spec.run.micro_batches)
    for agent, node in (("long", "work_l"), ("aggregator", "aggregate")):
        samples, tokens = rows[node]
        assert samples == 4  # 2 plans × n = 2
        want = episodes * samples * math.ceil(tokens / BLOCK_TOKENS)
        assert call_blocks(spec, (agent,), 512) == want
    assert rows["aggregate"][1] > rows["work_l"][1]  # it shows work_l's 64 tokens and more


def test_the_size_stays_between_the_floor_and_the_memory_share(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m")  # 2 layers, 2 heads of 64: 2 KiB a token
    small = one_node(tmp_path, max_tokens=8, n=2, episodes=2, mbs=1)
    assert kv_cache_bytes(small, ("a",), model, "float32", 16 * GIB) == CPU_KV_CACHE_BYTES
    # 128 episodes a micro-batch × 8 samples (256 at once) × 1 block × 128 × 2 KiB = 64 MiB;
    # 4 blocks a row: 256 MiB
    step = one_node(tmp_path, max_tokens=400, n=8, episodes=256, mbs=2)
    assert kv_cache_bytes(step, ("a",), model, "float32", 16 * GIB) == 256 * 4 * 128 * 2048
    tight = kv_cache_bytes(step, ("a",), model, "float32", 1 * GIB)
    assert tight == int(KV_RAM_SHARE * GIB)  # what does not fit runs in waves
    assert kv_cache_bytes(step, ("a",), tmp_path / "missing", "float32", GIB) == CPU_KV_CACHE_BYTES
