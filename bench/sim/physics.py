"""Paper-scale costs from physics: every task body bounded by bytes over a bandwidth or FLOPs
over a peak, on the device that really does the work — never divided over devices that do
not share it.

What `RooflineCosts` (`costs.py`) divided and this model does not:

- **Loads and wakes are per replica.** An inference replica of tensor-parallel degree tp
  holds a whole copy of the weights, so each of its devices moves weights/tp over its own
  host link, whatever the number of replicas: loading a 32B model onto tp-4 replicas takes
  16 GB / 25.6 GB/s ≈ 0.64 s, on 4 devices or on 768.
- **Data parallelism is capped by the sequences.** A training task of s sequences on n
  devices (ZeRO-3, one rank per device) gives work to min(n, s) ranks; the step waits for
  the rank with the most tokens (sequences assigned longest first), so one long response
  holds a training step as it holds a decode batch.
- **ZeRO-3 has a communication floor.** Every forward/backward of a micro-step all-gathers
  the parameters twice and reduce-scatters the gradients: ≈ 3·Ψ·2 bytes through each
  device's slowest link (HCCS within one node, RoCE across nodes), repeated per micro-step
  (ceil(s / ranks)); a micro-step lasts at least that long (DeepSpeed prefetches, so the
  floor is max(compute, communication), not their sum).
- **A training-state swap** moves 16 B/param over the host links of the devices holding
  it: checked against the paper's ~11 s for a 32B agent in `paper_table`.

A `Schedule` says which system's choices a run makes (how many FLOPs a trained token costs,
how a weight publication travels, what a role change and an agent change move): FlexMARL's
(our pipeline), MARTI's (as its code does it), and the MAS-RL assumptions. Every constant
is in `Hardware` / `Schedule` with its source; nothing here is fitted to the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bench.sim.calibration import (
    ACC_64G,
    CPU_HERE,
    EFFICIENCY,
    MODELS,
    TRAIN_FLOPS_PER_PARAM_TOKEN,
    Efficiency,
    Hardware,
    LinearFit,
    ModelProfile,
)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A system's physical choices, each named after the code or text it comes from.

    - `train_flops`: FLOPs per trained token per parameter. 8 = forward + backward (6,
      Kaplan et al. 2020) with full recomputation (x4/3, Korthikanti et al. 2022). MARTI
      also runs the reference and the actor forward in `make_experience` before training
      (marti/trainer/ppo/experience_maker.py; the ref model is always created): +2 +2.
    - `publish`: how new weights reach the engines. "network": ZeRO-3 gathers the full
      weights (Ψ·2 B through each device's link), then each replica's devices receive
      weights/tp over RoCE (our disaggregated pipeline). "ipc": gathered, then handed to
      colocated engines by CUDA IPC (MARTI, `_broadcast_to_vllm`, use_cuda_ipc), no second
      transfer.
    - `role_change`: what a colocated worker moves when it changes between rollout and
      training. "sleep": vLLM sleep/wake level 1, weights/tp out or in per device, twice
      per change (MARTI wakes and sleeps the engines around rollout and again around the
      weight broadcast; its ZeRO-3 shards stay on the device, `adam_offload` makes its
      DeepSpeed sleep a no-op). "offload": the same plus the agent's training state over the
      host links (a whole-cluster MAS-RL that shares every device among agents). "reload":
      the engine is destroyed and created again (`engine_create_s`) and its weights loaded.
    - `agent_change`: what a rollout worker moves when it starts serving another agent:
      "resident" (nothing: a static partition or disaggregated hosts that keep every
      engine), "wake" (weights/tp per device), "reload" (a new engine, then its weights).
    - `cpu_adam`: the optimizer update runs on the host (MARTI's examples: adam_offload),
      gradients out and parameters back over the host links, the update at host DRAM speed.
    """

    name: str
    train_flops: float = TRAIN_FLOPS_PER_PARAM_TOKEN
    publish: str = "network"
    role_change: str = "none"
    agent_change: str = "resident"
    cpu_adam: bool = False
    # vLLM engine creation for a 14-32B model: process start, weight load from host memory,
    # graph capture; "tens of seconds" (vLLM's sleep-mode docs give avoiding it as the
    # reason sleep mode exists). 30 s is an ASSUMPTION, the low end.
    engine_create_s: float = 30.0


FLEXMARL = Schedule("flexmarl")
MARTI = Schedule(
    "marti",
    train_flops=TRAIN_FLOPS_PER_PARAM_TOKEN + 4,
    publish="ipc",
    role_change="sleep",
    cpu_adam=True,
)
# MAS-RL assumptions (the paper publishes no schedule): MARTI's per-agent choices, with the
# whole cluster shared by agents in turn, each change waking (or re-creating) the engine.
MASRL_SLEEP = replace(MARTI, name="mas-rl/sleep", role_change="offload", agent_change="wake")
MASRL_RELOAD = replace(
    MASRL_SLEEP, name="mas-rl/reload", role_change="reload", agent_change="reload"
)


def lpt_max(tokens: np.ndarray, ranks: int) -> float:
    """The largest per-rank total when sequences go longest-first to the least-loaded rank
    (what a length-aware data-parallel split achieves; a naive split does worse)."""
    if tokens.size == 0:
        return 0.0
    if ranks >= tokens.size:
        return float(tokens.max())
    load = np.zeros(ranks)
    for t in np.sort(tokens)[::-1]:
        load[int(load.argmin())] += t
    return float(load.max())


def replica_decode_s(
    m: ModelProfile, hw: Hardware, eff: Efficiency, prompts: np.ndarray, lengths: np.ndarray
) -> float:
    """Prefill + decode of one tp-way replica: each decode iteration reads the weights once and
    every running sequence's KV cache (memory-bound), plus 2·params FLOPs per token."""
    if lengths.size == 0:
        return 0.0
    bw, flops = m.tp * hw.hbm_bps * eff.hbm, m.tp * hw.peak_flops
    L = lengths.astype(np.float64)
    decode = (
        m.weight_bytes / bw * L.max()
        + 2 * m.params / (flops * eff.prefill_mfu) * L.sum()
        + m.kv_bytes_per_token / bw * float((prompts * L + L * L / 2).sum())
    )
    prefill = float(prompts.sum()) * 2 * m.params / (flops * eff.prefill_mfu)
    return prefill + decode


@dataclass(frozen=True, slots=True)
class PhysicsCosts:
    """The `Costs` protocol at paper scale, for one system's `Schedule`."""

    schedule: Schedule = FLEXMARL
    hw: Hardware = ACC_64G
    eff: Efficiency = EFFICIENCY
    overhead: LinearFit = CPU_HERE  # our orchestrator's per-task cost, measured here

    @property
    def dispatch_s(self) -> float:
        return self.overhead.dispatch

    @property
    def cores(self) -> float | None:
        return None

    @property
    def accelerators(self) -> bool:
        return True

    # ---- links ---------------------------------------------------------------------------
    def _host(self, nbytes: float) -> float:
        """Seconds for one device to move `nbytes` over its own host link."""
        return nbytes / (self.hw.host_bps * self.eff.link)

    def _ring(self, devices: int) -> float:
        """Per-device bandwidth of a collective over `devices`: the slowest link it crosses."""
        bps = self.hw.intra_bps if devices <= self.hw.per_node else self.hw.inter_bps
        return bps * self.eff.link

    def _gather_s(self, m: ModelProfile, devices: int) -> float:
        """One all-gather of the bf16 weights sharded over `devices` (ZeRO-3)."""
        if devices <= 1:
            return 0.0
        return m.weight_bytes * (devices - 1) / devices / self._ring(devices)

    # ---- rollout -------------------------------------------------------------------------
    def _replicas(self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int):
        m = MODELS[model]
        r = max(1, accel // m.tp)
        return [
            replica_decode_s(m, self.hw, self.eff, prompts[i::r], lengths[i::r]) for i in range(r)
        ]

    def generate(self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int) -> float:
        """A task's sequences go round-robin over the worker's accel // tp replicas (requests
        are placed before their lengths are known); the task ends with its slowest replica."""
        return self.overhead.gen_task + max(self._replicas(model, prompts, lengths, accel))

    def generate_active(
        self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int
    ) -> float:
        """Share of the worker's devices decoding, averaged over the task (active time)."""
        busy = self._replicas(model, prompts, lengths, accel)
        total = self.overhead.gen_task + max(busy)
        return MODELS[model].tp * sum(busy) / (accel * total) if total > 0 else 1.0

    def score(self, rows: int) -> float:
        return self.overhead.score_task + self.overhead.score_row * rows

    # ---- training ------------------------------------------------------------------------
    def train(self, model: str, tokens: np.ndarray, accel: int) -> float:
        """ZeRO-3 data parallel over the worker's devices: compute for the busiest rank,
        at least the parameter gathers of each micro-step (module docstring)."""
        m = MODELS[model]
        seqs = np.asarray(tokens, dtype=np.float64)
        ranks = max(1, min(accel, seqs.size))
        compute = self.schedule.train_flops * m.params * lpt_max(seqs, ranks)
        compute /= self.hw.peak_flops * self.eff.train_mfu
        micro_steps = math.ceil(seqs.size / ranks) if seqs.size else 0
        comm = micro_steps * 3 * self._gather_s(m, accel)
        return self.overhead.train_task + max(compute, comm)

    def step(self, model: str, accel: int) -> float:
        """Optimizer update + weight publication."""
        m = MODELS[model]
        if self.schedule.cpu_adam:  # grads out, params back, update in host DRAM
            per_device = m.params / accel
            link = self._host(per_device * 2 * 2)
            nodes = max(1, accel / self.hw.per_node)
            dram = 2 * m.train_state_bytes / nodes / (self.hw.host_mem_bps * self.eff.host_mem)
            update = link + dram
        else:  # on device: the sharded state read and written once
            update = 2 * m.train_state_bytes / (accel * self.hw.hbm_bps * self.eff.hbm)
        publish = self._gather_s(m, accel)
        if self.schedule.publish == "network":
            publish += m.weight_bytes / m.tp / (self.hw.inter_bps * self.eff.link)
        return self.overhead.step_task + update + publish

    def swap(self, model: str, accel: int) -> float:
        """One direction of a training-state swap: 16 B/param over the holding devices'
        host links."""
        return self._host(MODELS[model].train_state_bytes / max(1, accel))

    # ---- changes of agent and of role ----------------------------------------------------
    def _engine(self, m: ModelProfile, how: str) -> float:
        if how == "resident":
            return 0.0
        wake = self._host(m.weight_bytes / m.tp)
        return wake + (self.schedule.engine_create_s if how == "reload" else 0.0)

    def load(self, model: str, accel: int) -> float:
        """A rollout worker starts serving another agent (`Schedule.agent_change`)."""
        return self._engine(MODELS[model], self.schedule.agent_change)

    def switch(self, model: str, accel: int) -> float:
        """A colocated worker changes role (`Schedule.role_change`)."""
        m, how = MODELS[model], self.schedule.role_change
        if how == "none":
            return 0.0
        if how == "sleep":
            return 2 * self._engine(m, "wake")
        state = self.swap(model, accel) if how == "offload" else 0.0
        return self._engine(m, "reload" if how == "reload" else "wake") + state
