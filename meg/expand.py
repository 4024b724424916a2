"""Episode expansion: the exact invocations and samples one episode produces.

The same function plans invocations symbolically (for `meg show` and for checking a real
rollout) and at rollout time over the samples actually in the store, so the two cannot drift.

Lineage. Each sample carries the chain of (node, sample id) it descends from through
`per_sample` edges, itself included. An aggregate input of an invocation only sees parent
samples whose lineage agrees with the invocation's lineage on every node both contain: an
aggregator under planner sample 3 sees the workers' samples of planner sample 3 only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from meg.fanout import PER_SAMPLE, aggregate
from meg.graph import topological_order
from meg.samples import Lineage, SampleInfo
from meg.spec import MEGSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class InvocationPlan:
    node: str
    index: int
    episode: str
    lineage: Lineage
    inputs: tuple[tuple[str, tuple[SampleInfo, ...]], ...]

    @property
    def group_id(self) -> str:
        return f"{self.episode}/{self.node}/{self.index}"

    def sample_ids(self, n: int) -> tuple[str, ...]:
        return tuple(f"{self.group_id}/{s}" for s in range(n))

    def parent_ids(self) -> tuple[str, ...]:
        return tuple(s.id for _, s in self.input_samples())

    def input_samples(self) -> Iterator[tuple[str, SampleInfo]]:
        """(parent node, sample) of every input sample, in input order."""
        for parent, samples in self.inputs:
            for s in samples:
                yield parent, s

    def child_samples(self, n: int, scores: Sequence[float] | None = None) -> list[SampleInfo]:
        """The SampleInfo of this invocation's own `n` samples (for downstream planning)."""
        out = []
        for s, sid in enumerate(self.sample_ids(n)):
            score = 0.0 if scores is None else float(scores[s])
            out.append(SampleInfo(sid, self.node, (*self.lineage, (self.node, sid)), score))
        return out


def driver_of(node: NodeSpec) -> str | None:
    drivers = [p for p, rule in node.inputs.items() if rule == PER_SAMPLE]
    return drivers[0] if drivers else None


def _compatible(a: Lineage, b: Lineage) -> bool:
    da = dict(a)
    return all(da.get(n, sid) == sid for n, sid in b)


def plan_invocations(
    name: str,
    node: NodeSpec,
    parent_samples: Mapping[str, Sequence[SampleInfo]],
    episode: str,
) -> list[InvocationPlan]:
    """Invocations of `node` in one episode, given its parents' samples in that episode."""
    missing = [p for p in node.inputs if p not in parent_samples]
    if missing:
        raise KeyError(f"node {name!r}: no samples given for parent(s) {missing}")
    driver = driver_of(node)
    drivers: list[SampleInfo | None] = list(parent_samples[driver]) if driver else [None]
    plans = []
    for index, d in enumerate(drivers):
        lineage: Lineage = d.lineage if d is not None else ()
        inputs: list[tuple[str, tuple[SampleInfo, ...]]] = []
        for parent, rule in node.inputs.items():
            if parent == driver:
                inputs.append((parent, (d,) if d is not None else ()))
                continue
            seen = [s for s in parent_samples[parent] if _compatible(s.lineage, lineage)]
            chosen = aggregate(rule)(seen)
            if not chosen:
                raise ValueError(
                    f"node {name!r} invocation {index} of episode {episode!r}: no sample of "
                    f"parent {parent!r} shares its lineage"
                )
            inputs.append((parent, chosen))
        plans.append(InvocationPlan(name, index, episode, lineage, tuple(inputs)))
    return plans


@dataclass(frozen=True, slots=True)
class EpisodeExpansion:
    """Per node, in topological order: its invocations and its samples in one episode."""

    invocations: dict[str, list[InvocationPlan]] = field(default_factory=dict)
    samples: dict[str, list[SampleInfo]] = field(default_factory=dict)

    def counts(self) -> dict[str, tuple[int, int]]:
        return {n: (len(self.invocations[n]), len(self.samples[n])) for n in self.invocations}


def expand_episode(spec: MEGSpec, episode: str = "e0") -> EpisodeExpansion:
    """Symbolic expansion of one episode (all scores 0, so `best` picks the first)."""
    out = EpisodeExpansion()
    for name in topological_order(spec):
        node = spec.nodes[name]
        plans = plan_invocations(name, node, {p: out.samples[p] for p in node.inputs}, episode)
        out.invocations[name] = plans
        out.samples[name] = [s for plan in plans for s in plan.child_samples(node.n)]
    return out
