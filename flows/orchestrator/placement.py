"""Where each task of a run goes: which rollout engine serves a generate, which worker scores,
which worker trains an agent.

It places *weight units* (`meg.sharing`), not agents: LoRA agents that share a base are one
unit, so they are always served by the same rollout engines and trained on the same training
worker, where one resident base holds all their adapters. Generate tasks go where the
balancer says (`engines.rollout.balancer`: inter-agent and intra-agent load balancing, fed
the seconds each finished generate took); score tasks round-robin over the rollout
workers; each unit trains on one sticky training worker (its state stays resident there),
or, with `run.elastic`, where the allocator puts it step by step
(`engines.training.allocation`: fed every task's seconds, it moves a unit's training to a
less loaded training or rollout worker; the pipeline then hands its state over).
"""

from __future__ import annotations

import logging
import math

from engines.rollout.balancer import Balancer, BalancerConfig, HierarchicalBalancer, NoBalancing
from engines.training.allocation import (
    Allocation,
    AllocatorConfig,
    ElasticAllocator,
    FixedAllocation,
    Move,
)
from flows.cluster.start import Workers
from flows.orchestrator.futures import StepEnds
from meg import MEGSpec, topological_order
from meg.sharing import unit_of
from tasks.context import Timing

log = logging.getLogger(__name__)


def need_order(order: list[str], node_agent: dict[str, str]) -> list[str]:
    """Agents by the topological position of their first node: the order in which the next
    step's rollout needs their new weights."""
    first: dict[str, int] = {}
    for i, n in enumerate(order):
        first.setdefault(node_agent[n], i)
    return sorted(first, key=first.__getitem__)


def engine_slots(workers: Workers, n_units: int) -> int:
    """Model instances per rollout worker: enough on all of them for every weight unit (an
    agent with its own weights, or a base shared by LoRA agents)."""
    return math.ceil(n_units / len(workers.rollout))


def rollout_hosts(workers: Workers, n_units: int) -> list[str]:
    """Balancer host ids, `engine_slots` per rollout worker. A worker holds at most that
    many engines of the run (`tasks.worker.host_of`): the hosts of one unit on a worker
    share its engine, and a unit's engine goes when the balancer has moved its last host
    there elsewhere and another unit needs the room."""
    return [f"{w}#{i}" for i in range(engine_slots(workers, n_units)) for w in workers.rollout]


def host_worker(host: str) -> str:
    return host.rsplit("#", 1)[0]


def unit_parents(spec: MEGSpec, unit: dict[str, str], units: list[str]) -> dict[str, list[str]]:
    """Weight unit → the units whose output it reads (only units before it in `units`: a
    unit of LoRA agents can hold nodes on both sides of another's; the balancer's step model
    then sees the forward edges only)."""
    pos = {u: i for i, u in enumerate(units)}
    parents: dict[str, list[str]] = {u: [] for u in units}
    for node in spec.nodes.values():
        child = unit[node.agent]
        for p in node.inputs:
            parent = unit[spec.nodes[p].agent]
            if pos[parent] < pos[child] and parent not in parents[child]:
                parents[child].append(parent)
    return parents


class Placement:
    """The run's fixed placement (training workers, node order) and its live balancer."""

    def __init__(self, spec: MEGSpec, workers: Workers, balance: bool, elastic: bool = False):
        self.workers = workers
        self.order = topological_order(spec)
        self.agents = need_order(self.order, {n: spec.nodes[n].agent for n in self.order})
        self.unit = unit_of(spec, self.agents)  # agent → its weight unit (shared base or own)
        self.units = units = list(dict.fromkeys(self.unit[a] for a in self.agents))  # need order
        self.allocation: Allocation = (
            ElasticAllocator(units, workers.train, workers.rollout, AllocatorConfig())
            if elastic
            else FixedAllocation(units, workers.train)
        )
        self._ends = StepEnds(len(self.agents))
        hosts = rollout_hosts(workers, len(units))
        self.balancer: Balancer = (
            HierarchicalBalancer(
                units,
                hosts,
                BalancerConfig(window=spec.run.window),
                unit_parents(spec, self.unit, units),
            )
            if balance
            else NoBalancing(units, hosts)
        )
        self._scored = 0
        self._generates_left: dict[int, int] = {}

    def train_worker(self, agent: str, step: int) -> str:
        """The worker that trains `agent` in `step` (asked once per agent as the step's
        training is submitted)."""
        return self.allocation.worker_of(self.unit[agent], step)

    def finished(self, kind: str, worker: str, agent: str | None, timing: Timing) -> Move | None:
        """A task finished on `worker` (the id it was pinned to): its seconds feed the
        training allocation; once every optimizer step of a step is in, the allocation may
        move a unit (returned, for the log)."""
        training = kind in ("train_micro_batch", "optimizer_step", "hand_over")
        unit = self.unit[agent] if training and agent is not None else None
        self.allocation.observe(worker, unit, timing.seconds, timing.step)
        end = self._ends.stepped(timing.step, timing.end) if kind == "optimizer_step" else None
        return None if end is None else self.allocation.end_step(timing.step, end)

    def rollout_host(self, agent: str, est_tokens: int) -> str:
        """The engine (`worker#i`) that generates for `agent`; counted as busy until done."""
        return self.balancer.place(self.unit[agent], est_tokens)

    def score_worker(self) -> str:
        self._scored += 1
        return self.workers.rollout[self._scored % len(self.workers.rollout)]

    def expect_generates(self, step: int, n: int) -> None:
        self._generates_left[step] = self._generates_left.get(step, 0) + n

    def generated(
        self,
        host: str,
        est_tokens: int,
        agent: str,
        timing: Timing,
        *,
        tool: bool = False,
        startup: float = 0.0,
    ) -> None:
        """A generate finished: free its engine, feed the demand signal (when the task ran;
        a `tool` node's seconds are the environment's, not the agent's engine's; `startup`,
        the seconds it spent bringing its engine up, are nobody's), and let the balancer
        rebalance once every generate of the step is in."""
        step = timing.step
        self.balancer.complete(host, est_tokens)
        self.balancer.observe(
            self.unit[agent], timing.start, timing.end, step, demand=not tool, startup=startup
        )
        self._generates_left[step] -= 1
        if self._generates_left[step] == 0 and self.balancer.end_step(step):
            split = ", ".join(f"{u} {len(self.balancer.hosts_of(u))}" for u in self.units)
            log.info("rollout balancer after step %d: engines per agent %s", step, split)
