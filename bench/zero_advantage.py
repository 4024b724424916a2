"""Zero-advantage skipping: training time against the fraction of zero-advantage rows.

    python -m bench.zero_advantage [--small] [--json PATH] [--fractions 0,0.25,0.5,0.75]

One optimizer step of one agent (B sequences in M micro-batches, `bench.training`'s sizes)
with a fraction f of its GRPO groups (4 sequences each) at advantage 0 — the groups whose
rewards all agreed — timed with `loss.skip_zero_advantage` off and on, on the same model,
interleaved repetitions (medians). The zero groups are spread evenly over the batch, so a
micro-batch is rarely skipped whole. Keys per fraction: `off_s`, `on_s`, `ratio` (on / off)
and `ideal` (1 − f: what the forward and backward alone would give; AdamW's step over
every parameter does not shrink). `skip_train_time_ratio`: the ratio at f = 0.5.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
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

from bench.common import write_results
from bench.training import SIZES, Size, build_model, make_batch
from engines.training.batch import TrainMicroBatch
from engines.training.trainer import AgentTrainer, TrainConfig

GROUP = 4


def zeroed(mb: TrainMicroBatch, fraction: float) -> TrainMicroBatch:
    """`mb` with `fraction` of its groups of `GROUP` rows at advantage 0, spread evenly
    (group g is zeroed when ⌊(g+1)·f⌋ > ⌊g·f⌋)."""
    adv = mb.advantages.clone()
    for g in range(len(adv) // GROUP):
        if math.floor((g + 1) * fraction + 1e-9) > math.floor(g * fraction + 1e-9):
            adv[g * GROUP : (g + 1) * GROUP] = 0.0
    return dataclasses.replace(mb, advantages=adv)


def split(mb: TrainMicroBatch, parts: int) -> list[TrainMicroBatch]:
    """Contiguous micro-batches of the rows of `mb`."""
    bounds = [round(i * mb.num_seqs / parts) for i in range(parts + 1)]
    return [mb.rows(torch.arange(bounds[j], bounds[j + 1])) for j in range(parts)]


def one_step(tr: AgentTrainer, parts: list[TrainMicroBatch]) -> float:
    t0 = time.perf_counter()
    tr.begin_step()
    for j, mb in enumerate(parts):
        tr.accumulate(mb, part=j)
    tr.step()
    return time.perf_counter() - t0


def bench_fraction(
    trainers: dict[str, AgentTrainer], s: Size, fraction: float, reps: int
) -> dict[str, float]:
    full = zeroed(make_batch(s, s.batch, 7), fraction)
    parts = split(full, s.micro)
    zero = int((full.advantages == 0).sum()) / s.batch
    times: dict[str, list[float]] = {arm: [] for arm in trainers}
    for tr in trainers.values():  # warm-up
        one_step(tr, parts)
    for _ in range(reps):
        for arm, tr in trainers.items():
            times[arm].append(one_step(tr, parts))
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return {
        "fraction": round(zero, 4),
        "off_s": round(off, 4),
        "on_s": round(on, 4),
        "ratio": round(on / off, 4),
        "ideal": round(1 - zero, 4),
    }


def run(size: str, fractions: list[float], threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    s = SIZES[size]
    if s.batch % GROUP:
        raise ValueError(f"a batch of {s.batch} rows is not whole groups of {GROUP}")
    with tempfile.TemporaryDirectory(prefix="flexmarl-zeroadv-") as tmp:
        model = build_model(Path(tmp) / "m", s)
        base = TrainConfig(lr=1e-4)
        trainers = {
            "off": AgentTrainer("off", model, base),
            "on": AgentTrainer("on", model, dataclasses.replace(base, skip_zero_advantage=True)),
        }
        rows = [bench_fraction(trainers, s, f, s.reps) for f in fractions]
    at_half = next((r["ratio"] for r in rows if abs(r["fraction"] - 0.5) < 1e-9), None)
    return {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "size": dataclasses.asdict(s),
        "fractions": rows,
        "skip_train_time_ratio": at_half,
    }


def render(res: dict[str, Any]) -> None:
    s = res["size"]
    t = Table(
        title=f"zero-advantage skipping · one step of {s['batch']} sequences in {s['micro']} "
        f"micro-batches · {s['layers']}×{s['hidden']}, vocabulary {s['vocab']}"
    )
    for col in ("zero-adv fraction", "off (s)", "on (s)", "on / off", "1 − fraction"):
        t.add_column(col, justify="right")
    for r in res["fractions"]:
        t.add_row(
            f"{r['fraction']:.2f}",
            f"{r['off_s']:.3f}",
            f"{r['on_s']:.3f}",
            f"{r['ratio']:.3f}",
            f"{r['ideal']:.2f}",
        )
    Console().print(t)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="the tiny size (for tests)")
    p.add_argument("--fractions", default="0,0.25,0.5,0.75")
    p.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 4))
    p.add_argument("--json", default="bench/results/zero_advantage.json")
    args = p.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    res = run("small" if args.small else "full", fractions, args.threads)
    render(res)
    write_results(res, args.json)
    return res


if __name__ == "__main__":
    main()
