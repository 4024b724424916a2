"""Worker-local state: one copy per Dask worker process, found by key, never shipped.

This is an importable module on purpose (a dict defined in `__main__` would be pickled into
every task and the models reloaded on each call). Everything here is a
cache that can be rebuilt from the store and the StateStore: losing a worker loses no data.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from typing import Any

from engines.model_files import local_dir
from engines.tokenizers import tokenizer
from meg.sharing import WeightUnit, weight_units
from storage.state import Host, StateStore
from storage.store import MEGStore
from tasks.context import RunContext

_LOCK = threading.Lock()
_SLOTS: dict[tuple[str, str], Any] = {}


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


def tokenizer_of(ctx: RunContext, agent: str) -> Any:
    return tokenizer(ctx.spec.agents[agent].tokenizer_path)


@functools.lru_cache(maxsize=32)
def _plugins(entries: tuple[str, ...]) -> None:
    from workloads.plugins import import_on_worker

    import_on_worker(entries)


def plugins_of(ctx: RunContext) -> None:
    """The run's plug-in modules imported in this process (shipped to the worker by
    `workloads.plugins.ship`; a no-op where they already are)."""
    if ctx.spec.plugins:
        _plugins(tuple(ctx.spec.plugins))


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


def host_of(ctx: RunContext, agent: str, unit: WeightUnit | None = None) -> tuple[Any, float]:
    """This worker's model host for `agent` in this run: the engine of its weight unit (or
    of `unit`: a frozen external model sampling for `agent`, `tasks.external`).

    A full-weight agent has an engine of its own; LoRA agents that share a base share one
    engine serving an adapter each (`meg.sharing`), sized for all of them.

    Hosts are keyed by run: a long-lived cluster (tests, a deployment's Dask cluster) serves
    run after run, and a host still holding another run's weights must never serve this one.
    When a new run first asks, the other runs' hosts are handed over (`hand_over_hosts`).

    Also returns the seconds this call spent bringing the engine up: 0.0 when the worker
    already had it; else its build, or the wait for another task's build of it, or the
    hand-over. The rollout balancer leaves them out of what it measures: they are paid once,
    and a split on trial that counted them would lose to the split it replaced."""
    from engines.rollout.hosts import get_host, is_hosted, make_room

    t0 = time.time()
    if unit is None:
        unit = next(u for u in weight_units(ctx.spec) if agent in u.agents)
    hand_over_hosts(ctx)
    key, backend, model, opts = _host_args(ctx, unit)
    warm = is_hosted(key)
    if not warm and ctx.engine_slots:  # a new engine here: at most engine_slots (make_room)
        make_room(f"{ctx.run_id}/", ctx.engine_slots - 1)
    host = get_host(key, backend, model, **opts)
    return host, 0.0 if warm else time.time() - t0


def _host_args(ctx: RunContext, unit: Any) -> tuple[str, str, str, dict[str, Any]]:
    """(host key, backend, local model dir, backend options) of a weight unit's engine."""
    from engines.devices import engine_options, total_ram, worker_device
    from engines.kv_cache import kv_cache_bytes
    from engines.rollout.base import AdapterServing

    # the device options come from this worker's own hardware (its GPU, if it has one)
    device = worker_device(ctx.engine_gpu_share)
    model = local_dir(unit.model)
    opts: dict[str, Any] = {"dtype": unit.dtype, **engine_options(unit.backend, device)}
    if opts.get("kv_cache_bytes") is not None:  # a CPU vLLM engine: sized to hold a call
        opts["kv_cache_bytes"] = kv_cache_bytes(
            ctx.spec, unit.agents, model, unit.dtype, total_ram()
        )
    if unit.lora:
        ranks = [lora.r for a in unit.agents if (lora := ctx.spec.agents[a].lora) is not None]
        opts["adapters"] = AdapterServing(len(unit.agents), max(ranks))
    return f"{ctx.run_id}/{unit.name}", unit.backend, model, opts


_HAND_OVER = threading.Lock()


def hand_over_hosts(ctx: RunContext) -> None:
    """Give other runs' hosts to this run, or close them all, so memory does not grow.

    If every engine the worker holds for other runs was built for the same model, backend
    and options as one of this run's weight units, each is reset to the model's own weights
    and serves that unit (`hosts.adopt_host`): building them again would cost seconds on a
    CPU and tens of seconds on a GPU. Otherwise all of them are closed. Not some: vLLM
    engines of one process share global state, so an engine closed while another lives is
    parked until the last one goes (`vllm_engines`), and beside adopted engines that never
    happens on a long-lived worker (seen: parked engines piling up run after run)."""
    from engines.rollout.hosts import adopt_host, drop_host, host_specs

    with _HAND_OVER:
        specs = host_specs()
        others = {k: v for k, v in specs.items() if not k.startswith(f"{ctx.run_id}/")}
        if not others:
            return
        plan: dict[str, tuple[str, str, str, dict[str, Any]]] = {}  # old key → new host
        for unit in weight_units(ctx.spec):
            args = _host_args(ctx, unit)
            old = next((k for k, v in others.items() if k not in plan and v == args[1:]), None)
            if old is not None:
                plan[old] = args
        if len(plan) == len(others) and all(
            adopt_host(old, *args[:3], **args[3]) is not None for old, args in plan.items()
        ):
            return
        for key in host_specs():  # a failed reset too: this run's adopted ones with them
            drop_host(key)


def forget_other_runs(run_id: str) -> None:
    """Drop the trainers of other runs (frees memory in long-lived workers)."""
    with _LOCK:
        for key in [k for k in _SLOTS if k[0] != run_id]:
            _SLOTS.pop(key).close()
