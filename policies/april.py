"""`april` (Active Partial Rollouts): a micro-batch launches `over_provision` more episodes
than it trains; once `quota` of them are complete the others stop, and their partial
samples are carried (as the store's carry segment) into the next step, to be continued
first under the new weights, at most `max_carry` steps. The cut and the carry are the
root generate task's mechanism (`tasks.carry`); this module decides the counts and what a
MEG must be for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from meg import MEGSpec
from meg.policies import AprilRollout
from meg.registry import Registry
from policies.base import ROLLOUTS, Problem, Rollout


@ROLLOUTS.register("april")
@dataclass(frozen=True)
class April(Rollout[AprilRollout]):
    def launched(self, quota: int) -> int:
        return quota + math.ceil(quota * self.model.over_provision)

    def quota(self, launched: int) -> int:
        """The largest quota that launches no more than `launched` (at least 1)."""
        if launched <= 0:
            return 0
        q = math.floor(launched / (1.0 + self.model.over_provision))
        while self.launched(q + 1) <= launched:  # `launched` rounds up: search the exact
            q += 1
        while q > 0 and self.launched(q) > launched:
            q -= 1
        return max(1, q)

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        """An episode is cut at its root node: only there is nothing of it committed or
        scored yet (a sibling scored by its own reward would be trained twice if the episode
        were carried), so the graph needs exactly one node without inputs; and the skipped
        rounds of tool and conditional nodes are not carried yet."""
        out: list[Problem] = []
        agentic = [n for n, node in spec.nodes.items() if node.is_tool or node.when]
        if agentic:
            out.append(
                (
                    "run.rollout",
                    "the april rollout policy carries cut episodes into the next step, and "
                    f"this MEG has tool or conditional nodes ({', '.join(agentic[:3])}), whose "
                    "skipped rounds april does not carry yet; use another rollout policy",
                )
            )
        roots = [n for n, node in spec.nodes.items() if not node.inputs]
        if len(roots) != 1:
            out.append(
                (
                    "run.rollout",
                    "the april rollout policy cuts episodes at the MEG's root node, and this "
                    f"graph has {len(roots)} nodes without inputs ({', '.join(roots)}); use "
                    "`policy: full`, or give the graph a single entry node",
                )
            )
        return out
