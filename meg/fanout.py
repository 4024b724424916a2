"""Fan-out rules: how a child node consumes the samples of one parent.

`per_sample` is the *driver* rule: the child runs once per parent sample, so the episode
becomes a tree. The aggregate rules pick which of the (lineage-compatible) parent samples are
shown to a single child invocation. `best` ranks by the sample's `score`, which at rollout time
is the mean behaviour logprob (the policy's own confidence): rewards are only known after the
whole episode, so they cannot drive a choice made inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meg.registry import Registry
from meg.samples import SampleInfo

PER_SAMPLE = "per_sample"
Aggregate = Callable[[Sequence[SampleInfo]], tuple[SampleInfo, ...]]
AGGREGATES: Registry[Aggregate] = Registry("aggregating fan-out rule", reserved=(PER_SAMPLE,))


def register_fanout(name: str) -> Callable[[Aggregate], Aggregate]:
    return AGGREGATES.register(name)


def known_fanouts() -> tuple[str, ...]:
    return (PER_SAMPLE, *AGGREGATES.names())


def aggregate(name: str) -> Aggregate:
    return AGGREGATES.get(name)


@register_fanout("all")
def _all(samples: Sequence[SampleInfo]) -> tuple[SampleInfo, ...]:
    return tuple(samples)


@register_fanout("first")
def _first(samples: Sequence[SampleInfo]) -> tuple[SampleInfo, ...]:
    return tuple(samples[:1])


@register_fanout("best")
def _best(samples: Sequence[SampleInfo]) -> tuple[SampleInfo, ...]:
    # max() keeps the first of equal scores, so ties resolve deterministically.
    return (max(samples, key=lambda s: s.score),) if samples else ()
