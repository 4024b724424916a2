"""Sparse-RL's sparse-KV rollouts against dense ones: the memory, the sampler's mismatch, and
what training on them does to the held-out reward.

    python -m bench.sparse_rl [--small] [--model DIR] [--episodes N] [--repeats R]
                              [--seeds S] [--steps K] [--heldout N] [--json PATH]
                              [--scheduler ADDRESS] [--budget B,SINKS,WINDOW,EVERY]

The model is warm-started on `longtail` (heavy-tailed response lengths: a few sequences
run long, which is where a bounded cache saves). Two parts, each arm interleaved with the
other in every repeat or seed:

- engine: the same prompts (n = 4, temperature 1, 48 tokens, seed r in repeat r) decoded by
  the sparse-KV loop under the budget (`sparse`: `--budget`, default `BUDGET`) and under a
  budget no sequence reaches (`dense`: the dense decode token for token, as
  `tests/engines/rollout/test_sparse_kv.py` checks), so both arms' KV bytes are measured the
  same way, from the cache tensors the loop holds.
  `sparse_kv_bytes_ratio`: the KV bytes per sequence at the batch's peak, sparse over dense
  (median over repeats). `sparse_logprob_mismatch`: the mean |stored − dense teacher-forced|
  logprob over the sparse arm's sampled tokens (`dense_logprob_mismatch`: the same for the
  dense arm, float noise), with `sparse_max_logprob_mismatch` the largest.
- training: the longtail workload on the `hf` backend for `steps` steps, each seed once
  with dense rollouts (`dense`: the `recompute` anchor) and once with `run.rollout: sparse`
  at that budget (`sparse`: the `sparse_rl` anchor), then each run's final models evaluated
  densely on the held-out split (`heldout` episodes a task). `sparse_heldout_reward_delta`:
  the median over seeds of sparse minus dense of the same seed; `dense_heldout_spread`: the
  dense arm's own max − min over seeds, to compare it with; `sparse_weight_mean`: the mean
  correction weight the sparse runs' steps reported (1 when nothing is rejected or
  reweighted).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
from contextlib import ExitStack
from datetime import date
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console
from rich.table import Table

from bench.common import cpu_model, teacher_forced_logprobs, train_run, write_results
from bench.cut import longtail_prompts
from bench.longtail import build_model, config_copy, heldout_reward
from engines.rollout.base import SamplingParams, SparseKV, make_backend
from engines.rollout.hf_backend import HFBackend
from storage.store import MEGStore

BUDGET = SparseKV(budget=24, sinks=4, window=8, every=4)
UNBOUNDED = dataclasses.replace(BUDGET, budget=1 << 20)
ARMS = ("dense", "sparse")


def mismatch(hf: HFBackend, prompts: list[list[int]], outs: list[list[Any]]) -> list[float]:
    """|stored − dense teacher-forced| logprob of every sampled token."""
    gaps: list[float] = []
    for prompt, group in zip(prompts, outs, strict=True):
        for c in group:
            want = teacher_forced_logprobs(hf.model, prompt, list(c.response_ids))
            gaps += (torch.tensor(c.logprobs) - want).abs().tolist()
    return gaps


def engine_arm(
    hf: HFBackend, arm: str, prompts: list[list[int]], seed: int, budget: SparseKV
) -> dict[str, Any]:
    kv = budget if arm == "sparse" else dataclasses.replace(budget, budget=UNBOUNDED.budget)
    outs = hf.generate(prompts, SamplingParams(n=4, max_tokens=48, seed=seed, sparse_kv=kv))
    gaps = mismatch(hf, prompts, outs)
    return {
        "kv_bytes_per_seq": statistics.fmean(hf.kv_bytes),
        "tokens": sum(len(c.response_ids) for g in outs for c in g),
        "mismatch_mean": statistics.fmean(gaps),
        "mismatch_max": max(gaps),
    }


def engine(model: str, episodes: int, repeats: int, budget: SparseKV) -> dict[str, Any]:
    prompts = longtail_prompts(model, episodes)
    hf = make_backend("hf", model)
    assert isinstance(hf, HFBackend)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    for rep in range(repeats):
        for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
            runs[arm].append(engine_arm(hf, arm, prompts, rep + 1, budget))
    arms = {a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for a, rs in runs.items()}
    ratios = [
        s["kv_bytes_per_seq"] / d["kv_bytes_per_seq"]
        for s, d in zip(runs["sparse"], runs["dense"], strict=True)
    ]
    return {
        "engine_arms": arms,
        "sparse_kv_bytes_ratio": round(statistics.median(ratios), 4),
        "sparse_kv_bytes_ratio_spread": round(max(ratios) - min(ratios), 4),
        "sparse_logprob_mismatch": round(arms["sparse"]["mismatch_mean"], 6),
        "sparse_max_logprob_mismatch": round(max(r["mismatch_max"] for r in runs["sparse"]), 6),
        "dense_logprob_mismatch": round(arms["dense"]["mismatch_mean"], 8),
    }


def config(arm: str, model: str, out: Path, steps: int, seed: int, budget: SparseKV) -> Path:
    """The longtail workload on `model` (hf backend), 8 episodes a step, with `arm`'s
    rollouts: `sparse` also gives every agent Sparse-RL's correcting anchor."""
    path = config_copy("longtail", "hf", model, out, steps, 8, 16, seed)
    data = yaml.safe_load(path.read_text())
    if arm == "sparse":
        data["run"]["rollout"] = {"policy": "sparse", **dataclasses.asdict(budget)}
        for agent in data["agents"].values():
            agent["loss"] = {**agent.get("loss", {}), "old_logprobs": "sparse_rl"}
    path = out / f"longtail-{arm}-s{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def weight_mean(summary: dict[str, Any]) -> float:
    """The mean correction weight over the run's training steps, every agent."""
    store = MEGStore.open(summary["store_url"], summary["run_id"], create=False)
    means = [
        rec["extra"]["metrics"]["is_weight_mean"]
        for a in store.agents()
        for rec in store.table(a).consumption_log().values()
    ]
    return statistics.fmean(means)


def training(
    model: str,
    work: Path,
    sizes: tuple[int, int, int],
    budget: SparseKV,
    scheduler: str | None,
) -> dict[str, Any]:
    """Every seed's dense and sparse runs (interleaved) on one default cluster (started here,
    or the one at `scheduler`: the arms are compared by reward, not time), and their final
    models' held-out reward."""
    from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api

    with prefect_api(), ExitStack() as stack:
        if scheduler is None:
            scheduler = stack.enter_context(dask_cluster(ClusterConfig())).address
        return _training(model, work, sizes, budget, scheduler)


def _training(
    model: str, work: Path, sizes: tuple[int, int, int], budget: SparseKV, scheduler: str
) -> dict[str, Any]:
    seeds, steps, heldout = sizes
    rewards: dict[str, list[float]] = {a: [] for a in ARMS}
    weights: list[float] = []
    for seed in range(seeds):
        for arm in ARMS if seed % 2 == 0 else ARMS[::-1]:
            cfg = config(arm, model, work, steps, seed, budget)
            run_dir = work / f"{arm}-{seed}"
            out = train_run(cfg, run_dir, scheduler)
            rewards[arm].append(round(heldout_reward(cfg, run_dir, heldout), 4))
            if arm == "sparse":
                weights.append(weight_mean(out))
    deltas = [s - d for s, d in zip(rewards["sparse"], rewards["dense"], strict=True)]
    return {
        "heldout_reward": rewards,
        "sparse_heldout_reward_delta": round(statistics.median(deltas), 4),
        "dense_heldout_spread": round(max(rewards["dense"]) - min(rewards["dense"]), 4),
        "sparse_heldout_spread": round(max(rewards["sparse"]) - min(rewards["sparse"]), 4),
        "sparse_weight_mean": round(statistics.fmean(weights), 4),
    }


def run(
    sizes: tuple[int, int, int, int, int],
    work: Path,
    warm: int | None,
    model: str | None,
    scheduler: str | None = None,
    budget: SparseKV = BUDGET,
) -> dict[str, Any]:
    """Both parts at `sizes` (episodes, repeats, seeds, steps, held-out episodes a task) on
    `model` (None: a longtail model warm-started here, `warm` steps or its preset's)."""
    episodes, repeats, seeds, steps, heldout = sizes
    model = model or build_model("longtail", work, warm)
    res: dict[str, Any] = {
        "date": str(date.today()),
        "machine": cpu_model(),
        "cpus": os.cpu_count(),
        "episodes": episodes,
        "repeats": repeats,
        "seeds": seeds,
        "steps": steps,
        "heldout_episodes": heldout,
        "budget": dataclasses.asdict(budget),
    }
    res |= engine(model, episodes, repeats, budget)
    if seeds:
        res |= training(model, work, (seeds, steps, heldout), budget, scheduler)
    return res


def render(res: dict[str, Any]) -> None:
    t = Table(
        title=f"sparse-KV rollouts · {res['episodes']} prompts × 4 · {res['repeats']} repeats"
    )
    for col in ("arm", "KV bytes / seq", "tokens", "mean |Δ logprob|", "held-out reward"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    for arm, r in res["engine_arms"].items():
        held = res.get("heldout_reward", {}).get(arm)
        t.add_row(
            arm,
            f"{r['kv_bytes_per_seq']:.0f}",
            f"{r['tokens']:.0f}",
            f"{r['mismatch_mean']:.4f}",
            "-" if held is None else ", ".join(f"{x:.3f}" for x in held),
        )
    Console(width=120).print(t)
    keys = [k for k in res if k.startswith(("sparse_", "dense_"))]
    print(", ".join(f"{k} {res[k]}" for k in keys))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--small", action="store_true", help="4 prompts, 1 repeat, 1 seed of 1 step, warm 2"
    )
    p.add_argument("--model", help="a longtail model (default: one built warm-started here)")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--heldout", type=int, default=2, help="episodes per held-out task")
    p.add_argument("--json", default="bench/results/sparse_rl.json")
    p.add_argument("--scheduler", help="run the training arms on this cluster (--small)")
    p.add_argument(
        "--budget",
        default=",".join(str(v) for v in dataclasses.astuple(BUDGET)),
        help="the sparse arm's budget,sinks,window,every",
    )
    args = p.parse_args(argv)
    sizes = (args.episodes, args.repeats, args.seeds, args.steps, args.heldout)
    warm = 2 if args.small else None
    if args.small:
        sizes = (4, 1, 1, 1, 1)
    with tempfile.TemporaryDirectory(prefix="flexmarl-sparse-") as tmp:
        kv = SparseKV(*(int(v) for v in args.budget.split(",")))
        res = run(sizes, Path(tmp), warm, args.model, args.scheduler, kv)
    render(res)
    write_results(res, args.json)
    return res


if __name__ == "__main__":
    main()
