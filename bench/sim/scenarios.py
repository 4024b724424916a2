"""The paper's setting, built as MEGs and worker layouts the pipeline can run.

MEGs (`chain_meg`, `fanout_meg`): N agents, alternately Qwen2.5-32B and -14B (agent 0 is
32B), one node each, a GRPO group of 8 per node; a child reads its parent's best answer
(`best`), so every node rolls out episodes × 8 samples. Response lengths by role: in a chain
they cycle long, medium, short; in a fanout the planner and aggregator are medium and the
workers cycle long, medium, short (the skew the balancer is for). The models are hub names,
which `meg.validate` accepts without looking for files; nothing is downloaded.

Layouts over `accel` accelerators (16 per node of 64 GB):

- disaggregated (`sync`, `flex`, `flex` without balancing, `async`): half the accelerators
  serve rollouts, as 2 rollout workers per agent (so the balancer has hosts to move), each
  a group of inference instances of `INSTANCE` accelerators (tp 4: a 32B replica, or two
  14B replicas of tp 2) behind one Dask worker, over which a generate task's sequences are
  spread; the other half train, as one worker per agent when there are at
  least `TRAIN_GROUP` accelerators per agent (data parallel over the group), otherwise as
  workers of `TRAIN_GROUP` shared by several agents through training slots (as many slots
  as 32B training states fit in 80% of the group's memory).
- colocated (`marti-like`, MARTI's layout: a placement group per agent, engines and trainer
  colocated, `marti/controllers/multi_agent_controller.py` of MARTI v1): every agent gets
  accel / N accelerators on which its rollout and its training take turns, its engines
  asleep while it trains; an agent's whole batch is one task (micro-batches: 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bench.sim.calibration import ACC_64G, MODELS, PAPER_LENGTHS, PAPER_PROMPT_TOKENS
from bench.sim.lengths import Lengths, LogNormalLengths
from bench.sim.physics import FLEXMARL, MARTI, MASRL_SLEEP, Schedule
from bench.sim.replay import Arm, Layout
from engines.training.catalog import loss_names
from meg import MEGSpec, build_spec, validate
from workloads.rewards import known_rewards

BIG, SMALL = "hf://Qwen/Qwen2.5-32B-Instruct", "hf://Qwen/Qwen2.5-14B-Instruct"
GROUP = 8  # samples per node (the GRPO group)
INSTANCE = 4  # accelerators of one inference instance (tp 4 for 32B, 2 × tp 2 for 14B)
ROLLOUT_WORKERS_PER_AGENT = 2  # rollout workers (groups of instances) per agent
TRAIN_GROUP = 16  # accelerators of a shared training worker (one node)
PER_NODE = 16


@dataclass(frozen=True, slots=True)
class Scenario:
    """One workload at one size: its MEG, lengths per node, batch sizes."""

    name: str
    spec: MEGSpec
    lengths: Mapping[str, Lengths]
    prompt_tokens: Mapping[str, float]
    episodes: int = 64  # the global batch
    micro_batches: int = 4  # micro-batch 16


def _agent(i: int, cls: str) -> dict[str, object]:
    return {
        "model": BIG if i % 2 == 0 else SMALL,
        "sampling": {"max_tokens": PAPER_LENGTHS[cls][1]},
    }


def _spec(name: str, agents: Mapping[str, object], nodes: Mapping[str, object]) -> MEGSpec:
    data = {
        "name": name,
        "agents": agents,
        "nodes": nodes,
        "rewards": {n: {"fn": "exact_answer"} for n in nodes},
        "team_nodes": [list(nodes)[-1]],
        "dataset": {"generator": "arithmetic", "train_size": 4096, "eval_size": 64},
        "run": {"episodes_per_step": 64, "micro_batches": 4},
    }
    spec = build_spec(data, f"<sim {name}>")
    return validate(spec, source=name, known_rewards=known_rewards(), known_losses=loss_names())


def _scenario(
    name: str, classes: list[str], inputs: list[list[str]], groups: list[int] | None = None
) -> Scenario:
    """Agent i owns node i (named n{i}), of length class classes[i], reading inputs[i], with
    groups[i] samples per episode (default GROUP)."""
    agents = {f"a{i}": _agent(i, c) for i, c in enumerate(classes)}
    nodes: dict[str, dict[str, object]] = {
        f"n{i}": {
            "agent": f"a{i}",
            "template": "Q: {question}" + "".join(f" {{{p}}}" for p in ins),
            "n": groups[i] if groups else GROUP,
            "inputs": dict.fromkeys(ins, "best"),
        }
        for i, ins in enumerate(inputs)
    }
    lengths = {f"n{i}": LogNormalLengths(PAPER_LENGTHS[c][0]) for i, c in enumerate(classes)}
    return Scenario(
        name, _spec(name, agents, nodes), lengths, dict.fromkeys(nodes, PAPER_PROMPT_TOKENS)
    )


CYCLE = ("long", "medium", "short")


def chain_meg(n: int) -> Scenario:
    classes = [CYCLE[i % 3] for i in range(n)]
    return _scenario(f"chain-{n}", classes, [[f"n{i - 1}"] if i else [] for i in range(n)])


def fanout_meg(n: int) -> Scenario:
    """A planner, n-2 workers, an aggregator (n ≥ 3; fewer agents: a chain)."""
    if n < 3:
        return chain_meg(n)
    workers = [f"n{i}" for i in range(1, n - 1)]
    classes = ["medium", *(CYCLE[i % 3] for i in range(n - 2)), "medium"]
    inputs = [[], *(["n0"] for _ in workers), workers]
    return _scenario(f"fanout-{n}", classes, inputs)


def routed_shares(n_workers: int) -> list[float]:
    """Zipf shares of a router's queries over its sub-agents (1, 1/2, 1/3, ..., normalised):
    the skewed per-agent request load of the paper's Merchant Assistant."""
    raw = [1 / (i + 1) for i in range(n_workers)]
    return [r / sum(raw) for r in raw]


def routed_meg(n: int) -> Scenario:
    """A router, n-2 sub-agents, an aggregator (n ≥ 3), every agent of medium length.

    The paper's MA workload routes each query to some sub-agents, so requests per agent are
    skewed. Our MEGs run every node for every episode, so the routing is modelled by its
    effect on load: sub-agent i samples a group in proportion to its routing share
    (`routed_shares`, at least 1), the same sequences per step a router would send it."""
    if n < 3:
        return chain_meg(n)
    workers = [f"n{i}" for i in range(1, n - 1)]
    per = [max(1, round(GROUP * len(workers) * s)) for s in routed_shares(len(workers))]
    classes = ["medium"] * n
    inputs = [[], *(["n0"] for _ in workers), workers]
    return _scenario(f"routed-{n}", classes, inputs, [GROUP, *per, GROUP])


WORKLOADS: dict[str, Callable[[int], Scenario]] = {
    "chain": chain_meg,
    "fanout": fanout_meg,
    "routed": routed_meg,
}


# ---- layouts --------------------------------------------------------------------------------
def disaggregated(n_agents: int, accel: int, per_agent: int = ROLLOUT_WORKERS_PER_AGENT) -> Layout:
    """`per_agent`: rollout workers per agent (the paper setting's inter-query degree)."""
    n_roll = min(per_agent * n_agents, accel // 2 // INSTANCE)
    if n_roll < n_agents:
        raise ValueError(
            f"{accel} accelerators give {n_roll} rollout instances for {n_agents} agents"
        )
    roll_size = accel // 2 // n_roll // INSTANCE * INSTANCE
    rollout = tuple(f"rollout-{i}" for i in range(n_roll))
    train_accel = accel - n_roll * roll_size
    if train_accel // n_agents >= TRAIN_GROUP:
        n_train, size = n_agents, train_accel // n_agents
    else:
        n_train, size = max(1, train_accel // TRAIN_GROUP), TRAIN_GROUP
    train = tuple(f"train-{i}" for i in range(n_train))
    state = MODELS[BIG].train_state_bytes
    slots = max(1, math.floor(0.8 * size * ACC_64G.mem_bytes / state))
    sizes = {**dict.fromkeys(rollout, roll_size), **dict.fromkeys(train, size)}
    return Layout(rollout, train, sizes, slots)


def colocated(n_agents: int, accel: int) -> Layout:
    size = accel // n_agents
    if size < INSTANCE:
        raise ValueError(f"{accel} accelerators cannot colocate {n_agents} agents")
    workers = tuple(f"worker-{i}" for i in range(n_agents))
    return Layout(workers, workers, dict.fromkeys(workers, size), 1)


def whole_cluster(n_agents: int, accel: int) -> Layout:
    """MAS-RL-like. The paper describes MAS-RL as stage-synchronous with its agents
    serialized and publishes no placement; our assumption: one worker of every accelerator
    in both roles, on which the agents take turns (each rolls out its whole batch, then
    trains), paying a role switch and a weight load at every change. As many training states
    stay resident as fit in 80% of the memory."""
    state = MODELS[BIG].train_state_bytes
    slots = max(1, min(n_agents, math.floor(0.8 * accel * ACC_64G.mem_bytes / state)))
    return Layout(("cluster",), ("cluster",), {"cluster": accel}, slots)


@dataclass(frozen=True, slots=True)
class Mode:
    arm: Arm
    layout: Callable[[int, int], Layout]
    micro_batches: int | None = None  # the scenario's unless set (MARTI, MAS-RL-like: one)
    schedule: Schedule = FLEXMARL  # the system's physical choices (physics.py)


MODES: dict[str, Mode] = {
    "sync": Mode(Arm("sync"), disaggregated),
    # MARTI as its code runs (physics.MARTI): an agent's whole batch at once on its own
    # colocated partition, engines asleep while it trains
    "marti-like": Mode(Arm("sync", balance=False), colocated, 1, MARTI),
    "flex": Mode(Arm("flex"), disaggregated),
    "flex-nobalance": Mode(Arm("flex", balance=False), disaggregated),
    "flex-elastic": Mode(Arm("flex", elastic=True), disaggregated),
    "async-1": Mode(Arm("async", 1), disaggregated),
    "mas-rl-like": Mode(Arm("sync", balance=False), whole_cluster, 1, MASRL_SLEEP),
}
PAPER_ACCEL = 48 * PER_NODE
