"""`srt` (speculative rollout): each sample drafts `draft` tokens from earlier rollouts of
its prompt (its siblings', and the engine's last `history` of that prompt) and the policy
verifies them in one forward pass: the sampled distribution is exactly the policy's, in
fewer passes. The drafting and verification are the `hf` engine's mechanism
(`engines.rollout.speculative`); nodes of no more tokens than a draft sample plainly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.rollout.base import Speculation
from meg import MEGSpec
from meg.policies import SpeculativeRollout
from meg.registry import Registry
from policies.base import ROLLOUTS, Problem, Rollout


@ROLLOUTS.register("srt")
@dataclass(frozen=True)
class Speculative(Rollout[SpeculativeRollout]):
    def speculation(self, max_tokens: int) -> Speculation | None:
        m = self.model
        if max_tokens <= m.draft:
            return None  # a few-token node (a verdict) has nothing to draft
        return Speculation(m.draft, m.match, m.history)

    def hf_only(self, spec: MEGSpec) -> set[str]:
        """The agents of a node longer than a draft: only the `hf` engine drafts."""
        return {
            n.agent
            for k, n in spec.nodes.items()
            if n.agent and self.speculation(spec.node_max_tokens(k)) is not None
        }

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        on_vllm = sorted(a for a in self.hf_only(spec) if spec.agents[a].backend == "vllm")
        if not on_vllm:
            return []
        return [
            (
                "run.rollout",
                "the srt rollout policy drafts and verifies on the hf backend; set "
                f"`backend: hf` (or leave `backend` out) for {', '.join(on_vllm)}",
            )
        ]
