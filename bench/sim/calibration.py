"""Every constant of the simulator, in one place, each with where it comes from.

Two device profiles:

- `cpu-here`: this machine (2 cores, tiny Llama models on vLLM's CPU build). A *fitted*
  linear model: the coefficients come from the timelines (`timeline.json`) `bench/e2e.py`
  keeps (`python -m bench.sim.fit tasks`, see the numbers quoted at each constant), fitted
  on its `flex` arm (task costs) and `marti-like` arm (effective cores); every other arm
  is out of sample.
- `acc-64g`: the paper's accelerator (16 per node, 64 GB each) with Qwen2.5-14B/32B agents,
  a *roofline* model from published hardware and model figures: decode is bound by reading
  the weights and the KV cache from HBM, prefill and training by FLOPs at a model FLOPs
  utilization (MFU), state movement by link bandwidths. Nothing of it is measured here.

Response lengths: `cpu-here` replays the empirical quantiles of the calibration runs (per
workload node); the paper scenarios draw from log-normals whose spread is the one measured
on our own long-tail workload (see `PAPER_LENGTHS`) and whose medians are assumptions,
stated as such (the paper does not report them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9


# ---- models --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What the cost model needs of a model: parameters, KV bytes per token, TP degree."""

    name: str
    params: float
    kv_bytes_per_token: float  # K and V, all layers, bf16
    tp: int  # tensor-parallel degree of one inference replica

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params  # bf16

    @property
    def train_state_bytes(self) -> float:
        """Mixed-precision Adam: bf16 weights + bf16 grads + fp32 master, m, v = 16 B/param
        (ZeRO paper, Rajbhandari et al. 2020, arXiv 1910.02054, §3: "16Ψ bytes")."""
        return 16.0 * self.params


# Qwen2.5 model cards / config.json (huggingface.co/Qwen/Qwen2.5-14B-Instruct,
# .../Qwen2.5-32B-Instruct): 14.7B params, 48 layers, 8 KV heads × 128 dims; 32.5B params,
# 64 layers, 8 KV heads × 128 dims. KV bytes/token = 2 (K,V) × layers × 8 × 128 × 2 B.
# TP: the smallest degree whose weights fit with room for KV cache on 64 GB devices
# (14B: 29 GB of weights → TP 2; 32B: 65 GB → TP 4).
MODELS: dict[str, ModelProfile] = {
    "hf://Qwen/Qwen2.5-14B-Instruct": ModelProfile("Qwen2.5-14B", 14.7e9, 2 * 48 * 8 * 128 * 2, 2),
    "hf://Qwen/Qwen2.5-32B-Instruct": ModelProfile("Qwen2.5-32B", 32.5e9, 2 * 64 * 8 * 128 * 2, 4),
}


# ---- the paper's accelerator -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hardware:
    """The paper's node: 16 accelerators of 64 GB, HCCS inside, RoCE between nodes. Each
    bandwidth is one device's own (its HBM, its PCIe link, its HCCS link, its RoCE port),
    so a transfer is never divided over devices that do not share it."""

    name: str
    mem_bytes: float
    peak_flops: float  # dense fp16/bf16 FLOP/s per device
    hbm_bps: float
    host_bps: float  # device ↔ host memory (swaps, offload, weight loads, sleep/wake)
    intra_bps: float  # device ↔ device inside a node
    inter_bps: float  # device ↔ device across nodes (weight publication, collectives)
    host_mem_bps: float  # a node's host DRAM (CPU-side optimizer updates)
    per_node: int


# Ascend 910B-class (what "16 accelerators of 64 GB per node" is): 64 GB HBM2e and ~320
# TFLOPS fp16 (boardor.com/blog/huawei-ascend-910b-outperforms-h20-910c-approaches-h100);
# HBM bandwidth 1.6 TB/s (the figure commonly quoted for the 910B; reports range 1.2-1.6,
# and the same article's 400 GB/s is a per-stack number); host link PCIe 4.0 x16 = 32 GB/s
# per direction (PCI-SIG spec); HCCS 56 GB/s per link (Atlas 800T A2 datasheet, as
# reported); RoCE v2 200 Gb/s = 25 GB/s per device (2 x 100 Gb/s ports per chip,
# vengineer.hatenablog.com/entry/2019/09/06/070000); host DRAM: 4 Kunpeng 920 sockets x 8
# channels of DDR4-2933 (23.5 GB/s each) ≈ 750 GB/s per node (Kunpeng 920 specification).
ACC_64G = Hardware(
    name="acc-64g",
    mem_bytes=64 * GB,
    peak_flops=320e12,
    hbm_bps=1.6e12,
    host_bps=32 * GB,
    intra_bps=56 * GB,
    inter_bps=25 * GB,
    host_mem_bps=750 * GB,
    per_node=16,
)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achieved fractions of the peaks above."""

    # decode reaches ~60-80% of HBM bandwidth in vLLM's memory-bound regime (the vLLM
    # paper, Kwon et al. SOSP'23, arXiv 2309.06180, Fig. 2/§2.3; we take the low end: TP
    # all-reduces and non-NVIDIA kernels)
    hbm: float = 0.6
    # prefill is compute-bound: ~50% MFU (Sarathi-Serve, Agrawal et al. OSDI'24, arXiv
    # 2403.02310, reports prefill near the compute roofline for chunks ≥ 512 tokens)
    prefill_mfu: float = 0.5
    # training: Megatron-LM reaches 52% MFU on A100 (Narayanan et al. SC'21, arXiv
    # 2104.04473, 163 of 312 TFLOPS); variable-length RL batches with ZeRO-3 reach less:
    # we take 35% (an estimate, stated as such)
    train_mfu: float = 0.35
    # links: ~80% of nominal
    link: float = 0.8
    # a CPU Adam streams fp32 states through host DRAM: half its peak (an estimate)
    host_mem: float = 0.5


EFFICIENCY = Efficiency()

# Training FLOPs per token: 6 × params (forward 2, backward 4; Kaplan et al. 2020, arXiv
# 2001.08361, §2.1), × 4/3 with full activation recomputation (Korthikanti et al. 2022,
# arXiv 2205.05198, §4): 8 × params.
TRAIN_FLOPS_PER_PARAM_TOKEN = 8.0

# Per-task orchestration cost at paper scale: what a task costs besides its body on our
# orchestrator, measured here (`cpu-here`: dispatch latency plus the fixed part of a task
# body: store reads/writes, Python), the same code path whatever the model size.
# Filled from CPU_HERE below.


# ---- cpu-here: fitted --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LinearFit:
    """Task seconds as a linear function of what the task does (fitted per phase).

    generate = gen_task + gen_iter × longest response + gen_token × all response tokens
               + gen_prompt × prompt tokens
    score    = score_task + score_row × rows
    train    = train_task + train_token × (prompt + response tokens)
    step     = step_task (optimizer + publication + checkpoint), + swap per slot swap
    """

    gen_task: float
    gen_iter: float
    gen_token: float
    gen_prompt: float
    score_task: float
    score_row: float
    train_task: float
    train_token: float
    step_task: float
    swap: float
    dispatch: float  # scheduler round trip between a dependency's end and a task's start
    cores: float  # effective cores the worker processes share (processor sharing)


# Fitted by `python -m bench.sim.fit tasks` (2026-12-03) on the timelines `bench/e2e.py`
# kept (bench/results/e2e_runs.json, packed; run 18:28-18:49 UTC, tiny Llama 2 layers ×
# 128 dims, vLLM CPU, 2 cores, 6 steps × 32 episodes, 2 micro-batches, 3 repeats, after
# the fix that shuts a dropped host's engine down: the earlier runs' workers carried every
# previous run's engines): task costs from the `flex` arm of math-chain and fanout (210
# generate and 210 train tasks of steps ≥ 1), effective cores from the `marti-like` arm
# against it. See docs/simulator.md.
CPU_HERE = LinearFit(
    gen_task=0.0601,
    gen_iter=0.0,  # not identifiable here: the tiny model's answers are ~2 tokens long
    gen_token=0.0,  # likewise (the fit puts the rows' cost on the prompt tokens)
    gen_prompt=3.15e-05,
    score_task=0.0250,  # median of the score tasks
    score_row=0.0,
    train_task=0.0354,
    train_token=4.04e-05,
    step_task=0.0311,  # median of the optimizer steps (update, publication, checkpoint)
    swap=0.009387,  # bench/results/training.json `swap_ms` (42 MB state): an upper bound
    dispatch=0.00171,  # median idle gap < 0.25 s between consecutive tasks of a worker
    # 2 physical cores, shared with the driver (scheduler, pipeline, Prefect server) and
    # with waits on I/O: the worker processes behave as if they shared 1.66
    # (`step_fit_cores`: the value whose simulated flex and marti-like step times are
    # closest to the measured ones; the median single marti-like task that ran beside
    # >= 2.5 others, against its (phase, agent) median in flex, says 1.92, and leaves
    # fanout marti-like 15.7% fast)
    cores=1.66,
)


# ---- response lengths --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LogNormal:
    """Response lengths ~ exp(N(ln median, sigma²)), rounded, at least 1, capped by the
    node's max_tokens."""

    median: float
    sigma: float


# The spread of response lengths measured on our long-tail workload (docs/meg-format.md,
# `longtail`: p50 4, p99 42 tokens): sigma = ln(42/4) / z(0.99) = ln(10.5) / 2.326.
LONGTAIL_SIGMA = math.log(42 / 4) / 2.326

# Paper scale: three length classes with the measured spread above. The medians and caps
# are ASSUMPTIONS (the paper does not report its response lengths): a solver-style agent
# answers in ~1k tokens under a 4k cap (the max_response_length of common math-RL recipes,
# e.g. verl's GSM8K/MATH examples use 1-4k), checkers and planners in a few hundred.
PAPER_LENGTHS: dict[str, tuple[LogNormal, int]] = {  # class → (distribution, max_tokens)
    "long": (LogNormal(1024, LONGTAIL_SIGMA), 4096),
    "medium": (LogNormal(384, LONGTAIL_SIGMA), 2048),
    "short": (LogNormal(128, LONGTAIL_SIGMA), 512),
}
PAPER_PROMPT_TOKENS = 256  # question + template of a node, before its parents' answers

# cpu-here: deciles (0, 0.1, ..., 1) of response lengths per workload node, and the prompt
# tokens of each node before its parents' answers: `python -m bench.sim.fit lengths` on the
# stores of two calibration runs made here on 2026-12-03 (math-chain and fanout, flex, 6
# steps × 32 episodes, steps ≥ 1, the tiny warm-started model of `make models`). The tiny
# model answers the arithmetic in ~2 tokens whatever the node's max_tokens.
_TWO = (1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0)
EMPIRICAL_LENGTHS: dict[str, dict[str, tuple[float, ...]]] = {
    "math-chain": {"solve": (*_TWO, 4.0), "verify": (*_TWO, 4.0)},
    "fanout": {
        "plan": (*_TWO, 3.0),
        "work_s": (*_TWO, 4.0),
        "work_m": (*_TWO, 4.0),
        "work_l": (*_TWO, 5.0),
        "aggregate": (*_TWO, 4.0),
    },
}
EMPIRICAL_PROMPTS: dict[str, dict[str, float]] = {
    "math-chain": {"solve": 10.0, "verify": 13.0},
    "fanout": {"plan": 10.0, "work_s": 12.0, "work_m": 12.0, "work_l": 12.0, "aggregate": 7.9},
}
