"""Fan-out rules: how a child node consumes the samples of one parent.

`per_sample` is the *driver* rule: the child runs once per parent sample, so the episode
becomes a tree. The aggregate rules pick which of the (lineage-compatible) parent samples are
shown to a single child invocation. `best` ranks by the sample's `score`, which at rollout time
is the mean behaviour logprob (the policy's own confidence): rewards are only known after the
whole episode, so they cannot drive a choice made inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meg.expand import SampleInfo

PER_SAMPLE = "per_sample"
Aggregate = Callable[[Sequence["SampleInfo"]], tuple["SampleInfo", ...]]
_AGGREGATES: dict[str, Aggregate] = {}


def register_fanout(name: str) -> Callable[[Aggregate], Aggregate]:
    def deco(fn: Aggregate) -> Aggregate:
        if name in _AGGREGATES or name == PER_SAMPLE:
            raise ValueError(f"fan-out rule {name!r} is already registered")
        _AGGREGATES[name] = fn
        return fn

    return deco


def known_fanouts() -> tuple[str, ...]:
    return (PER_SAMPLE, *sorted(_AGGREGATES))


def aggregate(name: str) -> Aggregate:
    try:
        return _AGGREGATES[name]
    except KeyError:
        raise KeyError(
            f"unknown fan-out rule {name!r}; known: {', '.join(known_fanouts())}"
        ) from None


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
