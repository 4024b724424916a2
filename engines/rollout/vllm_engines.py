"""vLLM engines of one process, and when they may be torn down.

vLLM engines in one process share global state (the parallel groups). When an in-process
engine is garbage-collected, its finalizer tears that state down
(`cleanup_dist_env_and_memory`), and every *other* engine of the process then fails its next
step with "pipeline model parallel group is not initialized" (seen in Dask workers that
replaced a crashed host, and in a test suite that built a second engine beside a shared
one). So a backend that dies while others live parks its engine here, and the parked engines
are shut down together once the last backend of the process is gone.

Two things of vLLM's outlive a closed engine unless they are let go here; a long-lived
rollout worker whose runs change models pays them every run:

- its memos, process-wide, per callable and per model name (`VLLM_CACHES`). `_supports_kw`
  is an `lru_cache` keyed by a bound method of the engine's tokenizer, which vLLM's renderer
  wraps in a class of its own per engine whose methods reach a queue of deep copies of the
  tokenizer. Every closed backend clears them (`forget_vllm_caches`): each is a pure memo (a
  signature inspection; a tokenizer load, milliseconds) that the next engine fills again;
- once its weights were updated, its layers and their weights, held by their own entries
  in vLLM's layerwise-reload table (`forget_reload_info`, before the engine shuts down).

What a closed engine left behind before and after: `bench/engine_churn.py`, measured in
docs/rollout.md#model-hosts-enginesrollouthostspy.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

# (module, function) of vLLM's process-wide memos that keep a closed engine's objects alive
VLLM_CACHES = (
    ("vllm.utils.func_utils", "_supports_kw"),  # keyed by the tokenizer's bound methods
    ("vllm.tokenizers.registry", "get_tokenizer"),  # a tokenizer per model name, up to 128
)


class Engines:
    """This process's live vLLM backends and the engines parked until none is left (see
    the module docstring)."""

    def __init__(self) -> None:
        self.live = 0
        self.parked: list[Any] = []
        self.lock = threading.Lock()

    def opened(self) -> None:
        with self.lock:
            self.live += 1

    def closed(self, llm: Any) -> None:
        """A backend was collected: keep its engine while another backend lives."""
        with self.lock:
            self.live -= 1
            if self.live > 0:
                self.parked.append(llm)
                released = []
            else:
                released, self.parked = [*self.parked, llm], []
        for engine in released:  # none left: tear them down now, not at some later gc
            _shut_down(engine)
        forget_vllm_caches()


def forget_vllm_caches() -> None:
    """Clear vLLM's memos (`VLLM_CACHES`, module docstring) in the modules already imported;
    a vLLM without one of them is left as it is."""
    for module, name in VLLM_CACHES:
        clear = getattr(getattr(sys.modules.get(module), name, None), "cache_clear", None)
        if callable(clear):
            clear()


def _shut_down(llm: Any) -> None:
    """Shut an in-process engine down now. Its own finalizer would do the same whenever the
    garbage collector reaches it (the engine holds reference cycles), possibly after a new
    engine was built, and tear the global state down under that one; `shutdown` detaches it."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        forget_reload_info(llm)
        core.shutdown()


def forget_reload_info(llm: Any) -> None:
    """Take the engine's layers out of vLLM's layerwise-reload table before it shuts down.

    Why: the table (`LAYERWISE_INFO`) is a `WeakKeyDictionary` keyed by layer, but once a
    layer's weights were reloaded (every weight update: `VLLMBackend.update_weights`) its
    entry holds parameters whose `weight_loader` is bound to the layer: the value keeps its
    own key alive, and with it the layer's weights, after the engine is gone (on a GPU they
    would hold GPU memory; not measured there). An engine that cannot run this (already
    broken) keeps its entries: logged, not raised, since shutting it down matters more."""
    try:
        llm.apply_model(_drop_layerwise_info)
    except Exception as e:  # a crashed engine: its shutdown must still run
        log.warning("vLLM engine: its layers stay in the reload table (%s)", e)


def _drop_layerwise_info(model: Any) -> int:
    """(Runs on the engine's model; None where the engine has none left.) Its layers' reload
    entries removed; how many."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    if model is None:
        return 0
    return sum(LAYERWISE_INFO.pop(m, None) is not None for m in model.modules())


ENGINES = Engines()
