"""GPU-node numbers in one run: bf16 updates, hf decoding, slot swap against a plain copy,
training throughput — on one device, with `--device cpu` running the same code (the keys that
need CUDA are reported as not measured: null).

    python -m bench.gpu --device cuda --shape qwen2-0.5b --json bench/results/gpu.json
    python -m bench.gpu --device cpu --shape tiny --json bench/results/gpu_cpu.json

Keys (docs/gpu.md states the targets):
- `bf16_update_fraction`: of the weights with a nonzero gradient, the share that one AdamW
  step at lr 1e-6 moved in a bfloat16 agent (float32 masters: all of them);
- `hf_device`, `hf_uses_worker_gpu`: the device the hf rollout engine is built on, as a
  rollout worker resolves it (engines.devices);
- `hf_decode_tok_s`: hf backend, 64 prompts × 128 new tokens, in the agent's dtype;
- `swap_out_s`, `swap_in_s`, `swap_ratio_vs_plain`, `swap_out_over_in`: one agent's training
  state (weights + AdamW) out to host memory and back through SlotManager/StateStore, against
  one copy of the same bytes out and in through a preallocated (pinned, on CUDA) buffer;
  steady state (the second and later swaps: the first one allocates the host buffers);
- `train_tok_s`, `train_mfu_bf16`: one optimizer step of `--train-seqs` × `--train-len`
  tokens in 4 micro-batches, bf16; MFU = 6·N·tokens/s over the device's dense bf16 peak
  (`--peak-tflops`, 989 for an H100/H200; CUDA only).

The model is random, built locally in the shape of a real family (no download).
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench.common import cpu_model, write_results
from engines.devices import engine_options, worker_device
from engines.rollout.base import SamplingParams
from engines.rollout.hf_backend import HFBackend
from engines.training.batch import TrainMicroBatch, build_microbatch
from engines.training.slots import SlotManager
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import Host, StateStore

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2-0.5B: 24 layers, hidden 896, 14 heads (2 KV), MLP 4864, tied 151,936 vocabulary
    "qwen2-0.5b": dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
    ),
    "tiny": dict(
        vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    ),
}  # fmt: skip


def build_model(shape: str, out: Path) -> tuple[str, int]:
    """A random Qwen2-family model of `shape` saved at `out`; (path, parameters)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(tie_word_embeddings=True, eos_token_id=0, pad_token_id=0, **SHAPES[shape])
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    return str(out), sum(p.numel() for p in model.parameters())


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any]) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def batch(vocab: int, seqs: int, length: int, seed: int) -> TrainMicroBatch:
    g = torch.Generator().manual_seed(seed)
    prompt = length // 4
    prompts = [torch.randint(3, vocab, (prompt,), generator=g).tolist() for _ in range(seqs)]
    resps = [torch.randint(3, vocab, (length - prompt,), generator=g).tolist() for _ in range(seqs)]
    old = [[-5.0] * len(r) for r in resps]
    adv = [1.0 if i % 2 else -1.0 for i in range(seqs)]
    return build_microbatch(prompts, resps, old, adv, pad_id=0)


def bf16_update_fraction(model: str, device: str, vocab: int) -> float:
    tr = AgentTrainer("a", model, TrainConfig(lr=1e-6, dtype="bfloat16"), device)
    before = {k: v.clone() for k, v in tr.state().items() if k.startswith("model/")}
    mb = batch(vocab, 4, 64, seed=1)
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    tr.step()
    after = tr.state()
    moved = had = 0
    for k, v in before.items():
        grad_seen = after[f"optim/{k[len('model/') :]}/exp_avg"] != 0
        moved += int(((after[k] != v) & grad_seen).sum())
        had += int(grad_seen.sum())
    tr.close()
    return moved / max(had, 1)


def train_throughput(
    model: str, device: str, vocab: int, seqs: int, length: int, agent: str = "t"
) -> tuple[float, AgentTrainer]:
    """tokens/s of one bf16 step of `seqs` × `length` in 4 micro-batches (after a warm-up);
    the trainer, with its AdamW state, for the swap measurement."""
    tr = AgentTrainer(agent, model, TrainConfig(lr=1e-6, dtype="bfloat16"), device)
    parts = [batch(vocab, max(1, seqs // 4), length, seed=10 + j) for j in range(4)]

    def step() -> None:
        tr.begin_step()
        for j, mb in enumerate(parts):
            tr.accumulate(mb, part=j)
        tr.step()

    step()  # warm-up: kernels, allocator, AdamW state
    seconds = timed(device, step)
    return sum(mb.num_tokens for mb in parts) / seconds, tr


def swap_numbers(trainers: list[AgentTrainer], device: str, rounds: int) -> dict[str, float]:
    """Two agents through one slot: each acquire of the other swaps one out and one in."""
    store = StateStore(f"file://{tempfile.mkdtemp(prefix='flexmarl-gpu-')}")
    by_agent = {t.agent: t for t in trainers}
    slots = SlotManager(1, store, offload_to=Host(), devices=(device,))
    outs: list[float] = []
    ins: list[float] = []
    order = [t.agent for t in trainers]

    def bind(agent: str) -> None:  # the trainers exist: the factory hands them over
        slots.acquire(agent, lambda _device: by_agent[agent])
        slots.release(agent)

    bind(order[0])
    for r in range(rounds):
        agent = order[(r + 1) % 2]
        before_out, before_in = slots.stats.swap_out_s, slots.stats.swap_in_s
        total = timed(device, functools.partial(bind, agent))
        out_s = slots.stats.swap_out_s - before_out
        in_s = slots.stats.swap_in_s - before_in
        outs.append(out_s)
        ins.append(max(total - out_s, in_s))  # asynchronous copies finish within `total`
    state = trainers[0].state() if not trainers[0].released else trainers[1].state()
    plain_out, plain_in = plain_copy(state, device)
    # rounds 0 and 1 swap each agent out for the first time (its host buffers are allocated;
    # round 0 swaps nothing in): the steady state is the median of the later rounds
    steady_out, steady_in = statistics.median(outs[2:]), statistics.median(ins[2:])
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    return {
        "swap_state_gb": nbytes / 1e9,
        "swap_first_out_s": outs[1],
        "swap_out_s": steady_out,
        "swap_in_s": steady_in,
        "plain_out_s": plain_out,
        "plain_in_s": plain_in,
        "swap_ratio_vs_plain": (steady_out + steady_in) / (plain_out + plain_in),
        "swap_out_over_in": steady_out / steady_in,
        "swap_gb_s": 2 * nbytes / 1e9 / (steady_out + steady_in),
    }


def plain_copy(state: dict[str, torch.Tensor], device: str) -> tuple[float, float]:
    """The same bytes out and in through one preallocated host buffer (pinned on CUDA)."""
    flat = [t.detach().reshape(-1).view(torch.uint8) for t in state.values() if t.numel()]
    total = sum(t.numel() for t in flat)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=device.startswith("cuda"))
    src = torch.cat([t.to(device) for t in flat])

    def out() -> None:
        host.copy_(src, non_blocking=True)

    def back() -> None:
        src.copy_(host, non_blocking=True)

    out()
    back()  # warm-up
    return timed(device, out), timed(device, back)


def hf_decode(model: str, device: str, dtype: str, prompts: int, new: int) -> float:
    engine = HFBackend(model, device=device, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 1000, (16,), generator=g).tolist() for _ in range(prompts)]
    params = SamplingParams(n=1, max_tokens=new, temperature=1.0, seed=0)
    engine.generate(rows[:4], SamplingParams(n=1, max_tokens=8, seed=0))  # warm-up
    out: list[Any] = []
    seconds = timed(device, lambda: out.extend(engine.generate(rows, params)))
    tokens = sum(len(c.response_ids) for group in out for c in group)
    return tokens / seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cuda:0" if args.device == "cuda" else "cpu"
    cuda = device.startswith("cuda")
    work = Path(tempfile.mkdtemp(prefix="flexmarl-gpu-model-"))
    model, params = build_model(args.shape, work / "model")
    vocab = SHAPES[args.shape]["vocab_size"]
    res: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "device": torch.cuda.get_device_name(0) if cuda else cpu_model(),
        "torch": torch.__version__,
        "shape": args.shape,
        "parameters": params,
    }
    hf = engine_options("hf", worker_device())["device"]
    res["hf_device"] = hf
    res["hf_uses_worker_gpu"] = hf.startswith("cuda") if cuda else None
    res["bf16_update_fraction"] = bf16_update_fraction(model, device, vocab)
    res["hf_decode_tok_s"] = hf_decode(
        model, device, "bfloat16" if cuda else "float32", args.prompts, args.new_tokens
    )
    tok_s, trainer = train_throughput(model, device, vocab, args.train_seqs, args.train_len)
    res["train_tok_s"] = tok_s
    res["train_mfu_bf16"] = 6 * params * tok_s / (args.peak_tflops * 1e12) if cuda else None
    _, other = train_throughput(model, device, vocab, 4, 64, agent="u")
    res |= swap_numbers([trainer, other], device, args.swap_rounds)
    return res


def render(res: dict[str, Any]) -> None:
    for k, v in res.items():
        shown = "not measured" if v is None else (f"{v:.4g}" if isinstance(v, float) else v)
        print(f"{k:<24} {shown}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--train-seqs", type=int, default=32)
    ap.add_argument("--train-len", type=int, default=256)
    ap.add_argument("--swap-rounds", type=int, default=5, help=">= 3 (two warm-up rounds)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.swap_rounds < 3:
        raise SystemExit("--swap-rounds must be >= 3: the first two allocate host buffers")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    res = run(args)
    render(res)
    if args.json:
        write_results(res, args.json)
    return res


if __name__ == "__main__":
    main()
