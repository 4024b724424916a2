"""Helpers of the `vllm` backend that need no engine: request seeds, reading vLLM's
logprobs, LoRA rank buckets and architecture support, the watch's stop rule for a stepped
engine, and a filter for a misleading reload warning (`engines/rollout/vllm_backend.py`
holds the backend and the why of each choice)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from engines.rollout.base import AdapterError, Watch


def watch_stops(
    watch: Watch, latest: dict[int, Any], over: set[int], ended: bool, looked: dict[int, int]
) -> list[int]:
    """The running requests `watch` stops after this engine step: each is looked at once its
    length passes the next multiple of `watch.every` (`looked`: the multiple it was last
    looked at), and all of them after a step in which a request ended (what a group-level
    rule waits for)."""
    out = []
    for i, c in latest.items():
        if i in over:
            continue
        tokens = c.token_ids
        due = len(tokens) // watch.every > looked.get(i, 0)
        if due:
            looked[i] = len(tokens) // watch.every
        if (due or ended) and watch.stop(i, tokens):
            out.append(i)
    return out


def request_seed(seed: int, index: int) -> int:
    """A distinct, reproducible 63-bit seed per prompt of a batch."""
    return (seed * 1_000_003 + index * 7_919 + 1) % (2**63)


class _BufferOnlyLayerFilter(logging.Filter):
    """Drops vLLM's per-update "RotaryEmbedding: Failed to load weights" warning.

    A rotary layer holds only a computed buffer (the cos/sin cache) that no checkpoint
    contains; vLLM's reload puts the old buffer back, which is correct, but logs the
    warning on every update. It sent a previous investigation down a false trail.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",)
        )


def quiet_reload_warnings() -> None:
    """Install the filter once on vLLM's layerwise-reload logger (idempotent)."""
    log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _BufferOnlyLayerFilter) for f in log.filters):
        log.addFilter(_BufferOnlyLayerFilter())


class _NoCpuTritonFilter(logging.Filter):
    """Drops vLLM's "Triton is installed, but doesn't include CPU backend. Disabling
    Triton." warning: a CPU engine never uses Triton, and the line (one per worker that
    starts an engine) was the only WARNING of a healthy CPU run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "doesn't include CPU backend" not in str(record.msg)


def quiet_import_warnings() -> None:
    """Install the filter on the logger of vLLM's Triton check (idempotent); before vLLM's
    first import in the process, which is when it logs."""
    log = logging.getLogger("vllm.triton_utils.importing")
    if not any(isinstance(f, _NoCpuTritonFilter) for f in log.filters):
        log.addFilter(_NoCpuTritonFilter())


def sampled_logprobs(steps: Any, ids: tuple[int, ...]) -> tuple[float, ...]:
    """Logprob of each sampled token from vLLM's per-position logprobs (`logprobs=0`).

    Flat form (`FlatLogprobs`): with `logprobs=0` each position holds exactly the sampled
    token, so the flat lists line up with `ids` and are read in one slice. Anything else
    (the list-of-dicts form) is read per position by token id.
    """
    flat_ids = getattr(steps, "token_ids", None)
    if flat_ids is not None and list(flat_ids) == list(ids):
        return tuple(float(x) for x in steps.logprobs)
    return tuple(float(d[t].logprob) for d, t in zip(steps or [], ids, strict=True))


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's `MaxLoRARanks`


def lora_rank_bucket(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise AdapterError(f"LoRA rank {rank} exceeds vLLM's largest ({VLLM_LORA_RANKS[-1]})")


def lora_architecture_problem(model_dir: Path) -> str | None:
    """Why vLLM cannot serve LoRA adapters on this model (None: it can), from vLLM's own
    model registry and `config.json`, without building an engine (a failed construction
    would leave vLLM's process-global state half set up)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    archs = cfg.get("architectures") or []
    try:
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_lora

        classes = [ModelRegistry._try_load_model_cls(a) for a in archs]
    except (ImportError, AttributeError):  # another vLLM: let the engine decide
        return None
    if any(c is not None and supports_lora(c) for c in classes):
        return None
    return (
        f"vLLM cannot serve LoRA adapters on {', '.join(archs) or cfg.get('model_type')} "
        "(its model class lacks LoRA support); give the LoRA agents of this model "
        "`backend: hf` (one base, switched adapters)"
    )
