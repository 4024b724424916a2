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
"""

from __future__ import annotations

import os

from flows.cluster.start import ClusterConfig

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


def default_layout(cfg: ClusterConfig, agents: int, mode: str, micro_batches: int) -> ClusterConfig:
    """`cfg` itself, or for a one-agent on-policy run on an untouched local cluster the spread
    layout (module docstring) on `cfg.cores` (default `usable_cores()`) cores."""
    cores = cfg.cores or usable_cores()
    if user_chose(cfg) or not spreads(agents, mode, cores):
        return cfg
    return ClusterConfig(
        **cfg.model_dump(exclude_unset=True),
        rollout_workers=min(cores, micro_batches),
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
