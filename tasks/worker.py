"""Worker-local state: one copy per Dask worker process, found by key, never shipped.

This is an importable module on purpose (a dict defined in `__main__` would be pickled into
every task and the models reloaded on each call). Everything here is a
cache that can be rebuilt from the store and the StateStore: losing a worker loses no data.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import Any

from engines.model_files import local_dir
from storage.state import Host, StateStore
from storage.store import MEGStore
from tasks.context import RunContext
from workloads.datasets import Splits, load_dataset

_LOCK = threading.Lock()
_SLOTS: dict[tuple[str, str], Any] = {}


def worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except ValueError:  # not inside a Dask worker
        return f"local-{os.getpid()}"


@functools.lru_cache(maxsize=16)
def _store(url: str, run_id: str, options_json: str) -> MEGStore:
    return MEGStore.open(url, run_id, storage_options=json.loads(options_json) or None)


def store_of(ctx: RunContext) -> MEGStore:
    """This worker's handle on the run's store, opened once (the storage options, e.g. S3
    credentials, are part of the key as canonical JSON)."""
    return _store(ctx.store_url, ctx.run_id, json.dumps(ctx.storage_options or {}, sort_keys=True))


@functools.lru_cache(maxsize=16)
def _state(url: str, options_json: str) -> StateStore:
    return StateStore(url, json.loads(options_json) or None)


def state_of(ctx: RunContext) -> StateStore:
    return _state(ctx.state_url, json.dumps(ctx.storage_options or {}, sort_keys=True))


@functools.lru_cache(maxsize=32)
def tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_dir(path))


@functools.lru_cache(maxsize=64)
def _chat_frame_ids(path: str, system: str | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    from meg.template import chat_frame

    tok = tokenizer(path)
    before, after = chat_frame(tok, system)

    def encode(text: str) -> tuple[int, ...]:
        return tuple(tok(text, add_special_tokens=False)["input_ids"]) if text else ()

    return encode(before), encode(after)


def chat_frame_of(node: Any, tok_path: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The (before, after) ids the tokenizer's chat template puts around a `chat:` node's
    user message; None for a plain-template node."""
    return None if node.chat is None else _chat_frame_ids(tok_path, node.chat.system)


def tokenizer_of(ctx: RunContext, agent: str) -> Any:
    a = ctx.spec.agents[agent]
    return tokenizer(a.tokenizer or a.model)


@functools.lru_cache(maxsize=32)
def _plugins(entries: tuple[str, ...]) -> None:
    from workloads.plugins import import_on_worker

    import_on_worker(entries)


def plugins_of(ctx: RunContext) -> None:
    """The run's plug-in modules imported in this process (shipped to the worker by
    `workloads.plugins.ship`; a no-op where they already are)."""
    if ctx.spec.plugins:
        _plugins(tuple(ctx.spec.plugins))


@functools.lru_cache(maxsize=8)
def _splits(spec_json: str) -> Splits:
    from meg.spec import DatasetSpec

    return load_dataset(DatasetSpec.model_validate_json(spec_json))


def splits_of(ctx: RunContext) -> Splits:
    plugins_of(ctx)  # a generator of the user's own
    return _splits(ctx.spec.dataset.model_dump_json())


def slots_of(ctx: RunContext) -> Any:
    """This worker's SlotManager for the run: `train_slots` slots, states offloaded to host."""
    from engines.training.slots import SlotManager

    key = (ctx.run_id, ctx.store_url)
    if key not in _SLOTS:
        forget_other_runs(ctx.run_id)
    with _LOCK:
        if key not in _SLOTS:
            _SLOTS[key] = SlotManager(
                ctx.train_slots,
                state_of(ctx),
                offload_to=Host(),
                devices=slot_devices(ctx.train_slots),
            )
        return _SLOTS[key]


def slot_devices(n: int) -> tuple[str, ...]:
    """The devices of this worker's `n` training slots: its own GPUs round-robin when it
    sees any (a dask-cuda worker sees one, as cuda:0), else the CPU. Found on the worker,
    never configured on the driver, whose devices may differ."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return tuple(f"cuda:{i % gpus}" for i in range(n)) if gpus else ("cpu",) * n


def host_of(ctx: RunContext, agent: str) -> Any:
    """This worker's model host for `agent` in this run: the engine of its weight unit.

    A full-weight agent has an engine of its own; LoRA agents that share a base share one
    engine serving an adapter each (`meg.sharing`), sized for all of them.

    Hosts are keyed by run: a long-lived cluster (tests, a deployment's Dask cluster) serves
    run after run, and a host still holding another run's weights must never serve this one.
    Hosts of other runs are dropped when a new run first asks, so memory does not grow."""
    from engines.rollout.base import AdapterServing
    from engines.rollout.hosts import drop_host, get_host, hosted_agents
    from meg.sharing import weight_units

    unit = next(u for u in weight_units(ctx.spec) if agent in u.agents)
    key = f"{ctx.run_id}/{unit.name}"
    for other in hosted_agents():
        if not other.startswith(f"{ctx.run_id}/"):
            drop_host(other)
    opts: dict[str, Any] = {"dtype": unit.dtype}
    if unit.lora:
        ranks = [lora.r for a in unit.agents if (lora := ctx.spec.agents[a].lora) is not None]
        opts["adapters"] = AdapterServing(len(unit.agents), max(ranks))
    return get_host(key, unit.backend, local_dir(unit.model), **opts)


def forget_other_runs(run_id: str) -> None:
    """Drop the trainers of other runs (frees memory in long-lived workers)."""
    with _LOCK:
        for key in [k for k in _SLOTS if k[0] != run_id]:
            _SLOTS.pop(key).close()
