"""`sparse` (Sparse-RL, Luo et al. 2026): every sample decodes with a bounded KV cache —
`budget` entries per sequence, layer and KV head: the first `sinks`, the last `window` and
the entries the recent queries attended most (`engines.rollout.sparse_kv`, the `hf`
engine's mechanism). The sampler is then not the dense policy: the stored behaviour
logprobs are the sparse sampler's, and the trainer corrects for the gap with Sparse-RL's
rejection and reweighting, the `sparse_rl` anchor (`engines.training.losses`): a run's
settings give it to every agent so sampled that names no anchor (`anchors`, applied by
`flows.runs.settle`), and `meg validate` refuses an agent that names another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.rollout.base import SparseKV
from meg import MEGSpec
from meg.policies import SparseRollout
from meg.registry import Registry
from policies.base import ROLLOUTS, Problem, Rollout

ANCHOR = "sparse_rl"  # the loss anchor that corrects for the sparse sampler


@ROLLOUTS.register("sparse")
@dataclass(frozen=True)
class SparseRL(Rollout[SparseRollout]):
    def kv_budget(self, max_tokens: int) -> SparseKV | None:
        """Every node: a prompt, not only the response, can outgrow the budget."""
        m = self.model
        return SparseKV(m.budget, m.sinks, m.window, m.every)

    def hf_only(self, spec: MEGSpec) -> set[str]:
        """Every agent that samples: only the `hf` engine evicts per sequence."""
        return {n.agent for n in spec.nodes.values() if n.agent}

    def anchors(self, spec: MEGSpec) -> dict[str, str]:
        return {a: ANCHOR for a in sorted(self.hf_only(spec))}

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        sampled = sorted(self.hf_only(spec))
        out: list[Problem] = []
        on_vllm = [a for a in sampled if spec.agents[a].backend == "vllm"]
        if on_vllm:
            out.append(
                (
                    "run.rollout",
                    "the sparse rollout policy evicts KV entries per sequence on the hf "
                    f"backend; set `backend: hf` (or leave `backend` out) for {', '.join(on_vllm)}",
                )
            )
        other = [
            a
            for a in sampled
            if "old_logprobs" in spec.agents[a].loss.model_fields_set
            and spec.agents[a].loss.old_logprobs != ANCHOR
        ]
        if other:
            out.append(
                (
                    "run.rollout",
                    "sparse rollouts are not the dense policy's samples and need Sparse-RL's "
                    f"correction in the loss, the `{ANCHOR}` anchor: drop `old_logprobs` from "
                    f"`loss:` (the run sets it) or set `{ANCHOR}` for {', '.join(other)}",
                )
            )
        return out
