"""Training Engine benchmark: train throughput, state swap cost, accumulation overhead.

    python -m bench.training [--small] [--json PATH] [--only {all,train,memory,packing}]

Keys (all measured in one run, medians over repetitions):
- `train_tok_s`: tokens/s of forward+backward+AdamW on one slot (all non-pad tokens).
- `grad_accum_overhead`: time of M micro-batches of b = B/M over one batch of B (same tokens).
- `swap_ms` / `swap_ratio_vs_copy`: one swap out + swap in of an agent's full training state
  (weights + AdamW moments) through SlotManager/StateStore to host memory, over a plain
  tensor copy of the same bytes to and from the same place (target ≤ 1.5).
- `swap_ms_url` / `swap_ratio_vs_copy_url`: the same through a local `file://` URL, over a
  plain `safetensors` save + load of the same tensors in the same folder.
- `logprob_peak_mb_new` / `logprob_peak_mb_full` / `logprob_memory_ratio` (new / full,
  target ≤ 0.3): peak host memory of ONE micro-batch forward + backward of
  `(token_logprobs(...) * response_mask).sum()`, the chunked response-only path against the
  full-vocabulary reference `_token_logprobs_full`, for a tied Qwen2-style model small enough
  that the vocabulary dominates (`MEM_SIZES`; shape in `logprob_*` keys). Each variant runs
  in a fresh `python` subprocess; its peak is the RSS high-water mark (`VmHWM`) at the end
  minus the RSS right after the model and inputs are built (on Linux the high-water mark is
  first reset to the current RSS through /proc/self/clear_refs, so import-time peaks cannot
  hide it; where the kernel refuses that reset, a 1 kHz thread samples the RSS instead —
  `logprob_peak_method` says which; a 16-token warm-up of the same variant runs before the
  baseline, so first-use costs are excluded).
  `logprob_ms_new` / `logprob_ms_full`: wall time of that forward + backward (one run);
  `logprob_sum_rel_diff`: |Σ new − Σ full| / |Σ full| over the response logprobs.
  Full size needs ~15 GB for the reference: `--only memory` runs just this part.
- `packed_train_speedup` (target ≥ 1.5) / `padding_share`: padding-free training
  (`optim.packing: by_length`) over the padded path on the longtail workload's lengths,
  `bench/training_packing.py` (`--only packing` runs just this part).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config

from bench.rss import RssSampler, maxrss_bytes, reset_peak_rss, rss_bytes
from bench.training_packing import run_packing
from engines.training.batch import (
    TrainMicroBatch,
    _token_logprobs_full,
    build_microbatch,
    token_logprobs,
)
from engines.training.slots import SlotManager
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import Host, Location, StateStore, Url


@dataclass(frozen=True, slots=True)
class Size:
    hidden: int
    layers: int
    vocab: int
    batch: int  # sequences per optimizer step (B)
    micro: int  # micro-batches per step (M)
    prompt: int
    response: int
    reps: int


SIZES = {
    "small": Size(hidden=64, layers=2, vocab=64, batch=8, micro=4, prompt=8, response=16, reps=3),
    "full": Size(
        hidden=256, layers=4, vocab=2048, batch=32, micro=4, prompt=32, response=96, reps=5
    ),
}


@dataclass(frozen=True, slots=True)
class MemSize:
    """Shape of the logprob peak-memory comparison: b sequences of T tokens, the last R
    of each are response tokens; a tied Qwen2-style model with one 64-dim head."""

    vocab: int
    seqs: int  # b
    seq_len: int  # T
    response: int  # R
    chunk: int  # token_logprobs(chunk_tokens=...)
    hidden: int = 64
    layers: int = 2


MEM_SIZES = {
    "small": MemSize(vocab=32_000, seqs=2, seq_len=256, response=192, chunk=128),
    "full": MemSize(vocab=151_936, seqs=8, seq_len=1024, response=768, chunk=1024),
}
_REPO = Path(__file__).resolve().parents[1]


def build_model(path: Path, s: Size) -> str:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=2 * s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def make_batch(s: Size, n: int, seed: int) -> TrainMicroBatch:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, s.vocab, (n, s.prompt), generator=g).tolist()
    responses = torch.randint(3, s.vocab, (n, s.response), generator=g).tolist()
    old = (-torch.rand(n, s.response, generator=g) - 4).tolist()
    adv = torch.randn(n, generator=g).tolist()
    return build_microbatch(prompts, responses, old, adv, pad_id=0)


def _median_s(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_train(tr: AgentTrainer, s: Size) -> dict[str, float]:
    full = make_batch(s, s.batch, 1)
    b = s.batch // s.micro
    parts = [make_batch(s, b, 1 + j) for j in range(s.micro)]
    n_tok = sum(p.num_tokens for p in parts)

    def one_batch() -> None:
        tr.begin_step(full.num_tokens, full.num_seqs)
        tr.accumulate(full)
        tr.step()

    def accumulated() -> None:
        tr.begin_step(n_tok, s.batch)
        for p in parts:
            tr.accumulate(p)
        tr.step()

    t_full = _median_s(one_batch, s.reps)
    t_acc = _median_s(accumulated, s.reps)
    tokens = int(full.attention_mask.sum())
    return {"train_tok_s": tokens / t_full, "grad_accum_overhead": t_acc / t_full}


def bench_swap(model: str, where: Location, store: StateStore, reps: int) -> float:
    """Median seconds of one swap out + swap in of agent 'a' through a 1-slot manager."""
    slots = SlotManager(1, store, offload_to=where)
    tr = slots.acquire("a", lambda d: AgentTrainer("a", model, TrainConfig(lr=1e-4), d))
    mb = make_batch(SIZES["small"], 2, 0)
    tr.begin_step(mb.num_tokens, 2)
    tr.accumulate(mb)
    tr.step()  # AdamW moments exist: the state is weights + 2 moments
    slots.release("a")

    def swap() -> None:
        slots.evict("a")
        slots.acquire("a", lambda d: tr)
        slots.release("a")

    return _median_s(swap, reps)


def bench_copy_host(tensors: dict[str, torch.Tensor], reps: int) -> float:
    def copy() -> None:
        out = {k: v.to("cpu", copy=True) for k, v in tensors.items()}
        {k: v.to("cpu", copy=True) for k, v in out.items()}

    return _median_s(copy, reps)


def bench_copy_file(tensors: dict[str, torch.Tensor], folder: Path, reps: int) -> float:
    def copy() -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "plain.safetensors")
        load_file(folder / "plain.safetensors")

    return _median_s(copy, reps)


def _memory_worker(variant: str, size: str, threads: int, sampled: bool = False) -> None:
    """Subprocess body: one forward + backward of one variant; prints one JSON line.

    `sampled=True` skips the high-water-mark reset, as on machines that refuse it.
    """
    m = MEM_SIZES[size]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=m.vocab,
        hidden_size=m.hidden,
        intermediate_size=2 * m.hidden,
        num_hidden_layers=m.layers,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=m.seq_len,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, m.vocab, (m.seqs, m.seq_len), generator=g)
    attn = torch.ones_like(ids)
    resp = torch.zeros((m.seqs, m.seq_len), dtype=torch.float32)
    resp[:, m.seq_len - m.response :] = 1.0
    fn = {"new": token_logprobs, "full": _token_logprobs_full}[variant]
    # warm-up on 16 tokens: first-use costs (library code pages, allocator and thread pools)
    # land before the baseline, not in the measured peak
    warm = torch.zeros((1, 16), dtype=torch.float32)
    warm[:, 8:] = 1.0
    (fn(model, ids[:1, :16], attn[:1, :16], warm, chunk_tokens=4) * warm).sum().backward()
    model.zero_grad(set_to_none=True)
    reset = not sampled and reset_peak_rss()
    base, base_rss = maxrss_bytes(), rss_bytes()
    with RssSampler() as sampler:
        t0 = time.perf_counter()
        logp = fn(model, ids, attn, resp, chunk_tokens=m.chunk)
        loss = (logp * resp).sum()
        loss.backward()
        wall = time.perf_counter() - t0
    # exact high-water mark where it could be reset, the sampled one otherwise
    peak = maxrss_bytes() - base if reset else sampler.peak - base_rss
    out = {"peak_bytes": peak, "wall_s": wall, "sum": float(loss), "reset": reset}
    print(json.dumps(out), flush=True)


def bench_logprob_memory(
    size: str, threads: int, sampled: bool = False
) -> dict[str, float | str | int]:
    m = MEM_SIZES[size]
    res: dict[str, dict[str, float]] = {}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for variant in ("new", "full"):
        code = (
            "from bench.training import _memory_worker; "
            f"_memory_worker({variant!r}, {size!r}, {threads}, {sampled})"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=_REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"logprob memory worker {variant!r} exited {proc.returncode}:\n"
                f"{proc.stderr[-2000:]}"
            )
        res[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        if res[variant]["peak_bytes"] <= 0:
            raise RuntimeError(
                f"logprob memory worker {variant!r} measured no memory growth "
                f"({res[variant]}): this machine's RSS accounting cannot see the allocation"
            )
    new, full = res["new"], res["full"]
    mb_new, mb_full = new["peak_bytes"] / 2**20, full["peak_bytes"] / 2**20
    return {
        "logprob_vocab": m.vocab,
        "logprob_seqs": m.seqs,
        "logprob_seq_len": m.seq_len,
        "logprob_response_tokens": m.response,
        "logprob_chunk_tokens": m.chunk,
        "logprob_peak_mb_new": round(mb_new, 1),
        "logprob_peak_mb_full": round(mb_full, 1),
        "logprob_memory_ratio": round(mb_new / mb_full, 4),
        "logprob_peak_method": "hwm" if new["reset"] and full["reset"] else "sampled",
        "logprob_ms_new": round(new["wall_s"] * 1e3, 1),
        "logprob_ms_full": round(full["wall_s"] * 1e3, 1),
        "logprob_sum_rel_diff": abs(new["sum"] - full["sum"]) / abs(full["sum"]),
    }


def run(size: str, threads: int, only: str = "all") -> dict[str, float | str | int]:
    out: dict[str, float | str | int] = {"size": size, "threads": threads}
    if only in ("all", "train"):
        out |= run_train(size, threads)
    if only in ("all", "memory"):
        out |= bench_logprob_memory(size, threads)
    if only in ("all", "packing"):
        out |= run_packing(size, threads)
    return out


def run_train(size: str, threads: int) -> dict[str, float | str | int]:
    s = SIZES[size]
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_model(root / "model", s)
        tr = AgentTrainer("a", model, TrainConfig(lr=1e-4))
        train = bench_train(tr, s)
        state = {k: v.clone() for k, v in tr.state().items()}
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        store = StateStore(f"file://{root}/states")
        reps = max(s.reps, 5)
        swap_host = bench_swap(model, Host(), store, reps)
        swap_url = bench_swap(model, Url(f"file://{root}/offload"), store, reps)
        copy_host = bench_copy_host(state, reps)
        (root / "plain").mkdir()
        copy_file = bench_copy_file(state, root / "plain", reps)
    return {
        "state_mb": round(nbytes / 2**20, 2),
        "train_tok_s": round(train["train_tok_s"], 1),
        "grad_accum_overhead": round(train["grad_accum_overhead"], 3),
        "micro_batches": s.micro,
        "swap_ms": round(swap_host * 1e3, 3),
        "copy_ms": round(copy_host * 1e3, 3),
        "swap_ratio_vs_copy": round(swap_host / copy_host, 3),
        "swap_ms_url": round(swap_url * 1e3, 3),
        "copy_ms_url": round(copy_file * 1e3, 3),
        "swap_ratio_vs_copy_url": round(swap_url / copy_file, 3),
    }


def main(argv: list[str] | None = None) -> dict[str, float | str | int]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny model, few reps (for tests)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: OpenMP spin-waits make multi-threaded "
        "timings swing 10x on a shared, oversubscribed machine)",
    )
    ap.add_argument(
        "--only",
        choices=("all", "train", "memory", "packing"),
        default="all",
        help="train: throughput/swap keys; memory: the logprob peak-memory comparison; "
        "packing: padding-free over padded training on the longtail lengths",
    )
    args = ap.parse_args(argv)
    old_threads = torch.get_num_threads()
    try:
        res = run("small" if args.small else "full", args.threads, args.only)
    finally:
        torch.set_num_threads(old_threads)
    table = Table(title="Training Engine")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in res.items():
        table.add_row(k, str(v))
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
