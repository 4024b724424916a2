"""`darts` (over-sample, keep the shortest): each group samples `over_sample` more
responses than the node's `n`; once `n` of a group have ended, the group's others stop
(`dropped`) and are never stored, so the group trains its `n` shortest finished responses
(`tasks.watch.keep_first`) and never waits for its own long tail. Like every watch, it
decides from the tokens drawn: a retried task stops the same requests."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.rollout.base import Watch
from meg.policies import DartsRollout
from policies.base import ROLLOUTS, NodeRequests, Rollout


@dataclass
class KeepFirst:
    """The engines' `Watch` that stops the rest of a group once `keep` of its requests
    have ended."""

    groups: Sequence[int]  # per request
    keep: int
    every: int = 1
    reason: str = "dropped"
    ended: dict[int, int] = field(default_factory=dict)

    def finish(self, i: int) -> None:
        g = self.groups[i]
        self.ended[g] = self.ended.get(g, 0) + 1

    def stop(self, i: int, tokens: Sequence[int]) -> bool:
        return self.ended.get(self.groups[i], 0) >= self.keep


@ROLLOUTS.register("darts")
@dataclass(frozen=True)
class Darts(Rollout[DartsRollout]):
    def samples(self, n: int) -> int:
        """Responses a group of `n` launches."""
        return n + math.ceil(n * self.model.over_sample)

    def watch(self, node: NodeRequests) -> tuple[Watch, int] | None:
        launched = self.samples(node.n)
        groups = [i // launched for i in range(len(node.tasks) * launched)]
        return KeepFirst(groups, keep=node.n), launched
