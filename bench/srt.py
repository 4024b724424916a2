"""Speculative rollout (SRT) at the engine: the hf backend's plain decode loop against the
speculative one, on the long-tail workload's prompts, side by side in one run.

    python -m bench.srt [--small] [--model DIR] [--episodes N] [--repeats R] [--json PATH]

The model is warm-started on `longtail` (what a run trains from). Each repeat samples the
same prompts (n = 4, temperature 1, 96 tokens, a new seed per repeat) through:

- `plain`: `generate` without speculation (the hf loop every other policy uses);
- `srt`: `run.rollout: {policy: srt}` (drafts of 4 from a 3-token suffix), the prompts'
  earlier rollouts already in the engine's history (a step after the first: prompts recur);
- `srt_cold`: the same with an empty history (a prompt's first step: siblings only);
- `srt_no_compaction`: `srt` with finished rows kept in the batch (what dropping them is
  worth, apart from the drafts).

Per arm: median seconds, tokens sampled, forward passes. Keys: `srt_engine_time_ratio`
(srt / plain), `srt_cold_time_ratio`, `srt_no_compaction_time_ratio`, `srt_passes_ratio`
(srt's passes / plain's, which decodes one token per pass) and `srt_logprob_gap` (the largest
gap between a logprob srt stored and the model's own under teacher forcing: the sampled
distribution is the policy's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench.common import teacher_forced_logprobs, write_results
from bench.cut import longtail_prompts
from bench.longtail import build_model
from engines.rollout.base import SamplingParams, Speculation, make_backend
from engines.rollout.hf_backend import HFBackend

SPEC = Speculation(draft=4, match=3, history=16)
ARMS = ("plain", "srt", "srt_cold", "srt_no_compaction")


def teacher_gap(hf: HFBackend, prompts: list[list[int]], outs: list[list[Any]]) -> float:
    """The largest |stored logprob − teacher-forced logprob| over every sampled token."""
    gap = 0.0
    for prompt, group in zip(prompts, outs, strict=True):
        for c in group:
            want = teacher_forced_logprobs(hf.model, prompt, list(c.response_ids))
            gap = max(gap, float((torch.tensor(c.logprobs) - want).abs().max()))
    return gap


def one(hf: HFBackend, arm: str, prompts: list[list[int]], seed: int) -> dict[str, Any]:
    spec = None if arm == "plain" else SPEC
    params = SamplingParams(n=4, temperature=1.0, max_tokens=96, seed=seed, speculate=spec)
    if arm != "plain":  # the history as a later step finds it (or empty: srt_cold)
        hf.drafts.clear()
        if arm != "srt_cold":
            hf.generate(prompts, dataclasses.replace(params, seed=seed + 10_000))
    hf.compact = arm != "srt_no_compaction"
    t0 = time.perf_counter()
    outs = hf.generate(prompts, params)
    wall = time.perf_counter() - t0
    hf.compact = True
    longest = max(len(c.response_ids) for g in outs for c in g)
    return {
        "wall_s": wall,
        "tokens": sum(len(c.response_ids) for g in outs for c in g),
        "passes": longest if arm == "plain" else hf.passes,
        "outs": outs,
    }


def run(
    episodes: int, repeats: int, work: Path, warm_steps: int | None, model: str | None = None
) -> dict[str, Any]:
    """Every arm `repeats` times on `model` (None: a longtail model warm-started here)."""
    model = model or build_model("longtail", work, warm_steps)
    prompts = longtail_prompts(model, episodes)
    hf = make_backend("hf", model)
    assert isinstance(hf, HFBackend)
    one(hf, "plain", prompts, 0)  # warm-up: first calls allocate
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    gap = 0.0
    for rep in range(repeats):
        for arm in ARMS:
            r = one(hf, arm, prompts, seed=rep + 1)
            if arm == "srt":
                gap = max(gap, teacher_gap(hf, prompts, r.pop("outs")))
            r.pop("outs", None)
            runs[arm].append(r)
    arms = {a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for a, rs in runs.items()}
    base = arms["plain"]
    return {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "episodes": episodes,
        "repeats": repeats,
        "speculation": dataclasses.asdict(SPEC),
        "arms": arms,
        "srt_engine_time_ratio": round(arms["srt"]["wall_s"] / base["wall_s"], 4),
        "srt_cold_time_ratio": round(arms["srt_cold"]["wall_s"] / base["wall_s"], 4),
        "srt_no_compaction_time_ratio": round(
            arms["srt_no_compaction"]["wall_s"] / base["wall_s"], 4
        ),
        "srt_passes_ratio": round(arms["srt"]["passes"] / base["passes"], 4),
        "srt_logprob_gap": round(gap, 6),
    }


def render(res: dict[str, Any]) -> None:
    t = Table(
        title=f"speculative rollout · {res['episodes']} prompts × 4 · median of {res['repeats']}"
    )
    for col in ("arm", "seconds", "tokens", "forward passes", "× plain"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    base = res["arms"]["plain"]["wall_s"]
    for arm, r in res["arms"].items():
        t.add_row(
            arm,
            f"{r['wall_s']:.3f}",
            f"{r['tokens']:.0f}",
            f"{r['passes']:.0f}",
            f"{r['wall_s'] / base:.3f}",
        )
    Console(width=120).print(t)
    keys = [k for k in res if k.startswith("srt_")]
    print(", ".join(f"{k} {res[k]}" for k in keys))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="8 prompts, 1 repeat, a 20-step warm start")
    p.add_argument("--model", help="a longtail model (default: one built warm-started here)")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default="bench/results/srt.json")
    args = p.parse_args(argv)
    episodes, repeats, warm = (8, 1, 20) if args.small else (args.episodes, args.repeats, None)
    with tempfile.TemporaryDirectory(prefix="flexmarl-srt-") as tmp:
        res = run(episodes, repeats, Path(tmp), warm, args.model)
    render(res)
    write_results(res, args.json)
    return res


if __name__ == "__main__":
    main()
