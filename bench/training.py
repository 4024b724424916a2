"""Training Engine benchmark: train throughput, state swap cost, accumulation overhead.

    python -m bench.training [--small] [--json PATH]

Keys (all measured in one run, medians over repetitions):
- `train_tok_s`: tokens/s of forward+backward+AdamW on one slot (all non-pad tokens).
- `grad_accum_overhead`: time of M micro-batches of b = B/M over one batch of B (same tokens).
- `swap_ms` / `swap_ratio_vs_copy`: one swap out + swap in of an agent's full training state
  (weights + AdamW moments) through SlotManager/StateStore to host memory, over a plain
  tensor copy of the same bytes to and from the same place (target ≤ 1.5).
- `swap_ms_url` / `swap_ratio_vs_copy_url`: the same through a local `file://` URL, over a
  plain `safetensors` save + load of the same tensors in the same folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from engines.training.batch import TrainMicroBatch, build_microbatch
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


def run(size: str, threads: int) -> dict[str, float | str | int]:
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
        "size": size,
        "threads": threads,
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
    args = ap.parse_args(argv)
    old_threads = torch.get_num_threads()
    try:
        res = run("small" if args.small else "full", args.threads)
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
