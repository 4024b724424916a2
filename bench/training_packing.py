"""Padding-free training on the longtail workload's lengths: training tokens per second of
`optim.packing: by_length` over the padded path (`none`), the part of `bench.training`
that `--only packing` runs.

    python -m bench.training --only packing --json bench/results/training_packing.json

The micro-batches are the longtail workload's (workloads/longtail.yaml): its prompts
(`"Q: list a..b\\nA:"` from the `longtail` generator, tokenized by the tiny model's own
tokenizer) and each response as long as its task's count of numbers (Pareto, shape 1.2,
from 2, capped at 40) plus the EOS, which gives p50 4 and p99 41 tokens against the
measured rollouts' p50 4, p99 42 (docs/meg-format.md#the-long-tail-workload); the JSON
records the drawn quantiles. A step is the workload's: 16 episodes × 4 samples in 2
micro-batches of 32 rows, on the workload's model (`flexmarl tiny-model`: Llama, 2 layers,
hidden 128). Each arm trains the same steps (begin_step, accumulate both micro-batches,
AdamW); the arms alternate within every repeat, their order swapped each repeat, so a
noisy neighbour slows both alike. `packed_train_speedup` is the median over repeats of
the per-repeat ratio of tokens/s (packed over padded), with its min–max;
`padding_share` is the share of the padded path's backbone token slots that are padding
(`packed_padding_share`: what the length groups still pad). `loss_rel_diff` checks that both
arms computed the same loss on the first step.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import results_header
from engines.training.batch import TrainMicroBatch, build_microbatch
from engines.training.packing import GROUP_COST_TOKENS, length_groups, padding_share
from engines.training.trainer import AgentTrainer, TrainConfig
from workloads.longtail import longtail
from workloads.tiny_model import build_tiny_model, load_tokenizer


@dataclass(frozen=True, slots=True)
class PackSize:
    rows: int  # rows of one micro-batch
    micro: int  # micro-batches of one step
    steps: int  # steps one arm trains per repeat
    reps: int
    hidden: int = 128  # the workloads' tiny model (workloads.tiny_model defaults)
    layers: int = 2
    intermediate: int = 256


PACK_SIZES = {
    "small": PackSize(rows=8, micro=2, steps=1, reps=3),
    "full": PackSize(rows=32, micro=2, steps=4, reps=11),
}
ARMS = {"padded": "none", "packed": "by_length"}


def longtail_rows(tokenizer: Any, n: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt ids, response length) of `n` longtail rows: the workload's tasks, each
    response as long as its answer's count of numbers + 1 (the EOS)."""
    rng = random.Random(seed)
    tasks = longtail(rng, n)  # the workload's generator at its defaults (yaml's params)
    out = []
    for question, answer in tasks:
        prompt = tokenizer(f"Q: {question}\nA:")["input_ids"]
        out.append((list(prompt), len(answer.split()) + 1))
    return out


def make_micro_batch(rows: list[tuple[list[int], int]], vocab: int, seed: int) -> TrainMicroBatch:
    g = torch.Generator().manual_seed(seed)
    prompts = [p for p, _ in rows]
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for _, n in rows]
    old = [(-torch.rand(n, generator=g) - 4).tolist() for _, n in rows]
    adv = torch.randn(len(rows), generator=g).tolist()
    return build_microbatch(prompts, responses, old, adv, pad_id=0)


def one_step(tr: AgentTrainer, mbs: list[TrainMicroBatch]) -> float:
    tr.begin_step(sum(m.num_tokens for m in mbs), sum(m.num_seqs for m in mbs))
    for j, mb in enumerate(mbs):
        tr.accumulate(mb, part=j)
    return tr.step().loss


def _quantile(xs: list[int], q: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_packing(size: str, threads: int) -> dict[str, Any]:
    s = PACK_SIZES[size]
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(
            Path(tmp) / "model", hidden=s.hidden, layers=s.layers, intermediate=s.intermediate
        )
        tok = load_tokenizer(model)
        n_mb = s.steps * s.micro
        rows = [longtail_rows(tok, s.rows, seed=100 + j) for j in range(n_mb)]
        mbs = [make_micro_batch(r, len(tok), seed=j) for j, r in enumerate(rows)]
        steps = [mbs[k * s.micro : (k + 1) * s.micro] for k in range(s.steps)]
        trainers = {
            arm: AgentTrainer("a", str(model), TrainConfig(lr=1e-6, packing=packing))
            for arm, packing in ARMS.items()
        }
        first = {arm: one_step(tr, steps[0]) for arm, tr in trainers.items()}  # + warm-up
        tok_s: dict[str, list[float]] = {arm: [] for arm in ARMS}
        tokens = sum(int(mb.attention_mask.sum()) for mb in mbs)
        for rep in range(s.reps):
            order = list(ARMS) if rep % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                t0 = time.perf_counter()
                for step in steps:
                    one_step(trainers[arm], step)
                tok_s[arm].append(tokens / (time.perf_counter() - t0))
    ratios = [p / q for p, q in zip(tok_s["packed"], tok_s["padded"], strict=True)]
    lengths = [[len(p) + n for p, n in r] for r in rows]
    padded = sum(len(x) * max(x) for x in lengths)
    real = sum(sum(x) for x in lengths)
    grouped = [length_groups(x) for x in lengths]
    slots = sum(
        len(g) * max(x[i] for i in g) for x, gs in zip(lengths, grouped, strict=True) for g in gs
    )
    responses = [n for r in rows for _, n in r]
    return results_header(
        size=size,
        threads=threads,
        repeats=s.reps,
        model=f"llama {s.layers} layers, hidden {s.hidden}, vocab {len(tok)}",
        rows_per_micro_batch=s.rows,
        micro_batches_per_step=s.micro,
        steps_per_repeat=s.steps,
        group_cost_tokens=GROUP_COST_TOKENS,
        response_len_p50=_quantile(responses, 0.5),
        response_len_p90=_quantile(responses, 0.9),
        response_len_p99=_quantile(responses, 0.99),
        prompt_len_mean=round(statistics.mean(len(p) for r in rows for p, _ in r), 1),
        padding_share=round(1 - real / padded, 4),
        packed_padding_share=round(1 - real / slots, 4),
        padding_share_per_micro_batch=[
            round(padding_share(x, [range(len(x))]), 4) for x in lengths
        ],
        groups_per_micro_batch=round(statistics.mean(len(g) for g in grouped), 2),
        padded_tok_s=round(statistics.median(tok_s["padded"]), 1),
        packed_tok_s=round(statistics.median(tok_s["packed"]), 1),
        packed_train_speedup=round(statistics.median(ratios), 3),
        packed_train_speedup_min=round(min(ratios), 3),
        packed_train_speedup_max=round(max(ratios), 3),
        packed_train_speedup_spread={"repeats": [round(r, 3) for r in ratios]},
        padded_tok_s_repeats=[round(v, 1) for v in tok_s["padded"]],
        packed_tok_s_repeats=[round(v, 1) for v in tok_s["packed"]],
        loss_rel_diff=abs(first["packed"] - first["padded"]) / max(abs(first["padded"]), 1e-12),
    )
