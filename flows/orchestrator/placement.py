"""Where each task of a run goes: which rollout engine serves a generate, which worker scores,
which worker trains an agent.

It places *weight units* (`meg.sharing`), not agents: LoRA agents that share a base are one
unit, so they are always served by the same rollout engines and trained on the same training
worker, where one resident base holds all their adapters. Generate tasks go where the
balancer says (`engines.rollout.balancer`: inter-agent and intra-agent load balancing, fed
the decode tokens each finished generate reports); score tasks round-robin over the rollout
workers; each unit trains on one sticky training worker (its state stays resident there).
"""

from __future__ import annotations

import math

from engines.rollout.balancer import Balancer, HierarchicalBalancer, NoBalancing
from flows.cluster.start import Workers
from meg import MEGSpec, topological_order
from meg.sharing import unit_of


def need_order(order: list[str], node_agent: dict[str, str]) -> list[str]:
    """Agents by the topological position of their first node: the order in which the next
    step's rollout needs their new weights."""
    first: dict[str, int] = {}
    for i, n in enumerate(order):
        first.setdefault(node_agent[n], i)
    return sorted(first, key=first.__getitem__)


def rollout_hosts(workers: Workers, n_units: int) -> list[str]:
    """Balancer host ids: enough model instances on the rollout workers for every weight
    unit (an agent with its own weights, or a base shared by LoRA agents)."""
    per = math.ceil(n_units / len(workers.rollout))
    return [f"{w}#{i}" for i in range(per) for w in workers.rollout]


def host_worker(host: str) -> str:
    return host.rsplit("#", 1)[0]


class Placement:
    """The run's fixed placement (training workers, node order) and its live balancer."""

    def __init__(self, spec: MEGSpec, workers: Workers, balance: bool) -> None:
        self.workers = workers
        self.order = topological_order(spec)
        self.agents = need_order(self.order, {n: spec.nodes[n].agent for n in self.order})
        self.unit = unit_of(spec, self.agents)  # agent → its weight unit (shared base or own)
        units = list(dict.fromkeys(self.unit[a] for a in self.agents))  # in need order
        train_of = {u: workers.train[i % len(workers.train)] for i, u in enumerate(units)}
        self.train_worker = {a: train_of[self.unit[a]] for a in self.agents}
        self.balancer: Balancer = (HierarchicalBalancer if balance else NoBalancing)(
            units, rollout_hosts(workers, len(units))
        )
        self._scored = 0
        self._generates_left: dict[int, int] = {}

    def rollout_host(self, agent: str, est_tokens: int) -> str:
        """The engine (`worker#i`) that generates for `agent`; counted as busy until done."""
        return self.balancer.place(self.unit[agent], est_tokens)

    def score_worker(self) -> str:
        self._scored += 1
        return self.workers.rollout[self._scored % len(self.workers.rollout)]

    def expect_generates(self, step: int, n: int) -> None:
        self._generates_left[step] = self._generates_left.get(step, 0) + n

    def generated(
        self, host: str, est_tokens: int, agent: str, decode_tokens: int, step: int
    ) -> None:
        """A generate finished: free its engine, feed the demand signal, and let the balancer
        rebalance once every generate of the step is in."""
        self.balancer.complete(host, est_tokens)
        self.balancer.observe(self.unit[agent], decode_tokens)
        self._generates_left[step] -= 1
        if self._generates_left[step] == 0:
            self.balancer.end_step()
