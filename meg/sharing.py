"""Which agents share weights: the unit that rollout engines and training workers hold.

A full-weight agent is its own unit: its engine and its trainer hold a whole model. LoRA
agents whose `model`, `backend` and `dtype` agree form one unit: one resident base (one
rollout engine serving an adapter per agent, one frozen base per training worker), plus a
small adapter per agent. Everything that places or counts weights — the balancer's host
split, the training-worker assignment, `meg show`'s memory report — works on these units,
so agents that share a base are always placed together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from meg.spec import MEGSpec


@dataclass(frozen=True, slots=True)
class WeightUnit:
    """One resident model: a full agent, or a base shared by LoRA agents."""

    name: str  # the agent's name, or the sharing agents' names joined by "+"
    model: str
    backend: str
    dtype: str
    agents: tuple[str, ...]
    lora: bool

    @property
    def shared(self) -> bool:
        return self.lora and len(self.agents) > 1


def trained_agents(spec: MEGSpec) -> list[str]:
    """Agents that some node uses, in the order the spec lists them."""
    used = {n.agent for n in spec.nodes.values()}
    return [a for a in spec.agents if a in used]


def weight_units(spec: MEGSpec, agents: Iterable[str] | None = None) -> tuple[WeightUnit, ...]:
    """The units of `agents` (default: every trained agent), in the order of `agents` (a
    shared unit sits where its first agent does); a unit's members, and so its name, follow
    the spec's order whatever the order of `agents`."""
    names = list(trained_agents(spec) if agents is None else agents)
    groups: dict[tuple[str, ...], list[str]] = {}
    key: tuple[str, ...]
    for a in names:
        spec_a = spec.agents[a]
        key = ("lora", spec_a.model, spec_a.backend, spec_a.dtype) if spec_a.lora else ("full", a)
        groups.setdefault(key, []).append(a)
    units = []
    rank = {a: i for i, a in enumerate(spec.agents)}
    for key, grouped in groups.items():
        members = sorted(grouped, key=rank.__getitem__)  # the name is the spec's order
        first = spec.agents[members[0]]
        units.append(
            WeightUnit(
                "+".join(members),
                first.model,
                first.backend,
                first.dtype,
                tuple(members),
                key[0] == "lora",
            )
        )
    return tuple(units)


def unit_of(spec: MEGSpec, agents: Iterable[str] | None = None) -> dict[str, str]:
    """agent → the name of its weight unit."""
    return {a: u.name for u in weight_units(spec, agents) for a in u.agents}
