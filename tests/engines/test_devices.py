"""Rollout engines follow the worker's device: the options are resolved on the worker from
what it sees. No GPU here: the CUDA side is checked with a fake device count (named as such),
the engine itself on a GPU by bench/gpu.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from engines.devices import (
    CPU_KV_CACHE_BYTES,
    DEVICE_OPTIONS,
    WorkerDevice,
    engine_options,
    total_ram,
    worker_device,
)
from engines.kv_cache import kv_cache_bytes
from engines.model_files import local_dir
from engines.rollout.base import known_backends
from meg.load import load_meg
from meg.sharing import weight_units
from tasks.context import RunContext
from workloads import BUILTIN


def test_a_worker_with_a_gpu_runs_its_hf_engine_on_it() -> None:
    """hf_uses_worker_gpu (bench/gpu.py's key), with a fake count of one GPU."""
    device = worker_device(gpu_count=lambda: 1)
    assert device.name == "cuda:0"
    assert engine_options("hf", device) == {"device": "cuda:0"}
    assert engine_options("hf", worker_device(gpu_count=lambda: 0)) == {"device": "cpu"}


def test_vllm_gets_gpu_defaults_on_a_gpu_and_cpu_defaults_on_a_cpu() -> None:
    cpu = engine_options("vllm", WorkerDevice("cpu"))
    assert cpu == {
        "kv_cache_bytes": CPU_KV_CACHE_BYTES,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
    }
    gpu = engine_options("vllm", WorkerDevice("cuda", 0, gpu_share=0.9))
    assert gpu["kv_cache_bytes"] is None  # sized by vLLM from the share
    assert gpu["gpu_memory_utilization"] == 0.9
    assert gpu["enforce_eager"] is False and gpu["enable_chunked_prefill"] is True


def test_every_backend_has_device_options_and_an_unknown_one_is_named() -> None:
    assert set(known_backends()) <= set(DEVICE_OPTIONS.names())
    with pytest.raises(Exception, match="nope"):
        engine_options("nope", WorkerDevice())


@pytest.mark.parametrize("bad", [{"kind": "tpu"}, {"gpu_share": 0.0}, {"gpu_share": 1.5}])
def test_a_bad_device_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        WorkerDevice(**bad)


@pytest.mark.parametrize(("gpus", "device"), [(0, "cpu"), (1, "cuda:0")])
def test_the_worker_builds_its_hf_engine_for_its_own_device(
    monkeypatch: pytest.MonkeyPatch, gpus: int, device: str
) -> None:
    """tasks.worker resolves the options where the engine is built: with a (fake) GPU the
    hf host's options name it; the run's GPU share reaches vLLM's options."""
    from tasks import worker

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)  # fake: no CUDA here
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    spec = load_meg(BUILTIN["math-chain"], check_models=False)
    ctx = RunContext("r", "file:///tmp/none", spec, rollout_gpu_share=0.7)
    for unit in weight_units(spec):
        for backend in ("hf", "vllm"):
            _, name, _, opts = worker._host_args(ctx, replace(unit, backend=backend))
            assert name == backend
            if backend == "hf":
                assert opts["device"] == device
            elif gpus:
                assert opts["gpu_memory_utilization"] == 0.7
            else:  # sized on the worker to hold the unit's largest call
                model = local_dir(unit.model)
                need = kv_cache_bytes(spec, unit.agents, model, unit.dtype, total_ram())
                assert opts["kv_cache_bytes"] == need >= CPU_KV_CACHE_BYTES
