"""Hierarchical rollout load balancing as a pure policy object (no Dask, no Prefect).

State in, placement out: the orchestrator and the cluster simulator both drive the same
object with `observe` / `end_step` / `place` / `complete`, and map host ids to whatever
they run on (Dask workers, simulated devices).

Inter-agent level — how many hosts each agent gets. Demand is the exponential moving
average of decode tokens per step, `d_a ← α·tokens_a + (1−α)·d_a`. The load of an agent is
`d_a / hosts_a`; when `max/min` over agents passes `threshold`, a new split is computed by
D'Hondt apportionment (every agent keeps ≥ 1 host; each further host goes to the agent with
the largest `d_a / hosts_a`), which minimizes the largest per-host load. Hysteresis, so the
split does not flap when demand hovers near a boundary: a new split is adopted only if it
lowers the largest per-host load by at least `min_gain` (a fraction), and not within
`cooldown_steps` of the previous change. Moves are minimal: an agent that loses hosts gives
up the ones with the fewest outstanding tokens; hosts that stay keep their agent.

Intra-agent level — `place(agent, est_tokens)` returns the agent's host with the fewest
outstanding tokens (ties: first in the agent's host order) and books `est_tokens` on it;
`complete(host, tokens)` releases them.

Hosts are dedicated to one agent at a time (a model is resident), so `hosts >= agents`.
Departure from the paper: the paper rebalances on a measured max/min ratio too, but does
not specify hysteresis; we add it because a policy that flaps pays a model swap per flip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    ema: float = 0.5  # weight of the newest step's decode tokens in the demand estimate
    threshold: float = 1.5  # rebalance when max/min per-host load across agents exceeds this
    min_gain: float = 0.1  # adopt a new split only if it cuts the max per-host load by 10%
    cooldown_steps: int = 1  # steps after a change during which the split stays put

    def __post_init__(self) -> None:
        if not 0 < self.ema <= 1:
            raise ValueError(f"BalancerConfig.ema must be in (0, 1], got {self.ema}")
        if self.threshold < 1:
            raise ValueError(f"BalancerConfig.threshold must be >= 1, got {self.threshold}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"BalancerConfig.min_gain must be in [0, 1), got {self.min_gain}")
        if self.cooldown_steps < 0:
            raise ValueError("BalancerConfig.cooldown_steps must be >= 0")


class Balancer(Protocol):
    def hosts_of(self, agent: str) -> tuple[str, ...]: ...
    def observe(self, agent: str, decode_tokens: int) -> None: ...
    def end_step(self) -> bool: ...
    def place(self, agent: str, est_tokens: int) -> str: ...
    def complete(self, host: str, tokens: int) -> None: ...


def equal_split(agents: Sequence[str], hosts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Host i goes to agent i mod A (so agents listed first get the leftover hosts)."""
    if len(set(agents)) != len(agents) or len(set(hosts)) != len(hosts):
        raise ValueError("agent names and host ids must be unique")
    if not agents:
        raise ValueError("need at least one agent")
    if len(hosts) < len(agents):
        raise ValueError(
            f"{len(hosts)} hosts for {len(agents)} agents: each agent needs its own host "
            "(hosts hold one resident model); add hosts or merge agents"
        )
    return {a: tuple(hosts[i :: len(agents)]) for i, a in enumerate(agents)}


def dhondt(demand: dict[str, float], n_hosts: int) -> dict[str, int]:
    """Host counts per agent: ≥ 1 each, the rest one at a time to the max demand/count."""
    counts = dict.fromkeys(demand, 1)
    for _ in range(n_hosts - len(demand)):
        best = max(demand, key=lambda a: (demand[a] / counts[a], -list(demand).index(a)))
        counts[best] += 1
    return counts


def load_ratio(demand: dict[str, float], counts: dict[str, int]) -> float:
    """max/min per-host load over agents with positive demand (1.0 if fewer than two)."""
    loads = [demand[a] / counts[a] for a in demand if demand[a] > 0]
    return max(loads) / min(loads) if len(loads) >= 2 else 1.0


class HierarchicalBalancer:
    """Demand-following host split per agent + fewest-outstanding-tokens placement."""

    def __init__(
        self, agents: Sequence[str], hosts: Sequence[str], config: BalancerConfig | None = None
    ) -> None:
        self.config = config or BalancerConfig()
        self.agents = tuple(agents)
        self.assignment = equal_split(agents, hosts)
        self.outstanding = dict.fromkeys(hosts, 0)
        self.demand: dict[str, float] = {}
        self._step_tokens = dict.fromkeys(agents, 0)
        self._since_change = self.config.cooldown_steps  # first rebalance is allowed
        self.changes = 0

    def hosts_of(self, agent: str) -> tuple[str, ...]:
        if agent not in self.assignment:
            raise KeyError(f"unknown agent {agent!r}; known: {', '.join(self.agents)}")
        return self.assignment[agent]

    def observe(self, agent: str, decode_tokens: int) -> None:
        self.hosts_of(agent)
        self._step_tokens[agent] += decode_tokens

    def counts(self) -> dict[str, int]:
        return {a: len(h) for a, h in self.assignment.items()}

    def end_step(self) -> bool:
        """Fold this step's tokens into the EMA; maybe re-split hosts. True if it changed."""
        a = self.config.ema
        for ag, tok in self._step_tokens.items():
            self.demand[ag] = tok if ag not in self.demand else a * tok + (1 - a) * self.demand[ag]
        self._step_tokens = dict.fromkeys(self.agents, 0)
        self._since_change += 1
        if self._since_change <= self.config.cooldown_steps:
            return False
        cur = self.counts()
        if load_ratio(self.demand, cur) <= self.config.threshold:
            return False
        new = dhondt(self.demand, len(self.outstanding))
        cur_max = max(self.demand[g] / cur[g] for g in self.agents)
        new_max = max(self.demand[g] / new[g] for g in self.agents)
        if new == cur or new_max > cur_max * (1 - self.config.min_gain):
            return False
        self._apply(new)
        self._since_change = 0
        self.changes += 1
        return True

    def _apply(self, counts: dict[str, int]) -> None:
        """Move the fewest hosts: surplus agents free their least-loaded hosts."""
        keep: dict[str, list[str]] = {}
        free: list[str] = []
        for ag in self.agents:
            hs = sorted(self.assignment[ag], key=lambda h: self.outstanding[h])
            surplus = len(hs) - counts[ag]
            free += hs[:surplus] if surplus > 0 else []
            kept = hs[surplus:] if surplus > 0 else hs
            keep[ag] = [h for h in self.assignment[ag] if h in kept]
        for ag in self.agents:
            while len(keep[ag]) < counts[ag]:
                keep[ag].append(free.pop(0))
        self.assignment = {ag: tuple(keep[ag]) for ag in self.agents}

    def place(self, agent: str, est_tokens: int) -> str:
        host = min(self.hosts_of(agent), key=lambda h: self.outstanding[h])
        self.outstanding[host] += est_tokens
        return host

    def complete(self, host: str, tokens: int) -> None:
        if host not in self.outstanding:
            raise KeyError(f"unknown host {host!r}")
        self.outstanding[host] = max(0, self.outstanding[host] - tokens)


class NoBalancing:
    """The benchmark's "off" arm: static equal split, round-robin within an agent."""

    def __init__(self, agents: Sequence[str], hosts: Sequence[str]) -> None:
        self.agents = tuple(agents)
        self.assignment = equal_split(agents, hosts)
        self.outstanding = dict.fromkeys(hosts, 0)
        self._next = dict.fromkeys(agents, 0)
        self.changes = 0

    def hosts_of(self, agent: str) -> tuple[str, ...]:
        if agent not in self.assignment:
            raise KeyError(f"unknown agent {agent!r}; known: {', '.join(self.agents)}")
        return self.assignment[agent]

    def observe(self, agent: str, decode_tokens: int) -> None:
        self.hosts_of(agent)

    def end_step(self) -> bool:
        return False

    def place(self, agent: str, est_tokens: int) -> str:
        hs = self.hosts_of(agent)
        host = hs[self._next[agent] % len(hs)]
        self._next[agent] += 1
        self.outstanding[host] += est_tokens
        return host

    def complete(self, host: str, tokens: int) -> None:
        if host not in self.outstanding:
            raise KeyError(f"unknown host {host!r}")
        self.outstanding[host] = max(0, self.outstanding[host] - tokens)
