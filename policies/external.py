"""`external` (external-policy rollouts): each group of a listed agent's nodes takes `rows`
of its `n` samples from an external policy — a frozen model named in the MEG (a stronger
model, or an earlier checkpoint) or a teammate's newest published policy — and the rest from
the agent itself. Exploration then reaches answers the learner would not write itself.

The mechanism is in the generate task (`tasks.external`: the external host, the rows' own
sampler logprobs and their `source`), the store (`source` names who sampled a row, and the
row claims no version of the agent: `storage.schema.EXTERNAL_VERSION`, checked by the
audit) and the loss: the `external` anchor (`engines.training.losses`) keeps `recompute` on
the agent's own rows and weighs an external row's tokens by LUFFY's shaped importance ratio
under the learner (Yan et al. 2025, "Learning to Reason under Off-Policy Guidance"). A run's
settings give that anchor to every listed agent that names none (`anchors`, applied by
`flows.runs.settle`); `meg validate` refuses an agent that names another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meg import MEGSpec
from meg.policies import ExternalRollout, ExternalSource
from meg.registry import Registry
from policies.base import ROLLOUTS, Problem, Rollout

ANCHOR = "external"  # the loss anchor that corrects for the external rows
FIELD = "run.rollout.sources"


@ROLLOUTS.register("external")
@dataclass(frozen=True)
class External(Rollout[ExternalRollout]):
    def external(self, agent: str) -> ExternalSource | None:
        return self.model.sources.get(agent)

    def anchors(self, spec: MEGSpec) -> dict[str, str]:
        return {a: ANCHOR for a in sorted(self.model.sources) if a in spec.agents}

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        out: list[Problem] = []
        for learner, source in sorted(self.model.sources.items()):
            out += [(FIELD, m) for m in _source_problems(spec, learner, source)]
        return out


def _source_problems(spec: MEGSpec, learner: str, source: ExternalSource) -> list[str]:
    """What is wrong with `source` drawing rows of `learner`'s groups in `spec`."""
    agents = sorted(spec.agents)
    if learner not in spec.agents:
        return [f"{learner!r} is not an agent of this MEG (agents: {', '.join(agents)})"]
    out: list[str] = []
    mate = source.agent
    if mate is not None and mate not in spec.agents:
        out.append(
            f"{learner}: the external agent {mate!r} is not an agent of this MEG "
            f"(agents: {', '.join(agents)})"
        )
    elif mate == learner:
        out.append(
            f"{learner}: an agent is not an external policy of itself; name a teammate or "
            "a frozen `model:`"
        )
    elif mate is not None and (theirs := spec.agents[mate].tokenizer_path) != (
        ours := spec.agents[learner].tokenizer_path
    ):
        out.append(
            f"{learner}: the external agent {mate!r} has another tokenizer ({theirs} against "
            f"{ours}); its samples are trained as the learner's token ids, so the two must "
            "share one"
        )
    sampled = [n for n, ns in spec.nodes.items() if ns.agent == learner and not ns.is_tool]
    if not sampled:
        out.append(f"{learner}: the agent samples at no node, so no group can take external rows")
    small = [f"{n} (n={spec.nodes[n].n})" for n in sampled if spec.nodes[n].n <= source.rows]
    if small:
        out.append(
            f"{learner}: {source.rows} external rows leave no sample of the agent's own in the "
            f"groups of {', '.join(small)}: set `rows` below each node's n"
        )
    loss = spec.agents[learner].loss
    if "old_logprobs" in loss.model_fields_set and loss.old_logprobs != ANCHOR:
        out.append(
            f"{learner}: external rows are not the agent's samples and need the `{ANCHOR}` "
            f"anchor's correction in the loss: drop `old_logprobs` from `loss:` (the run sets "
            f"it) or set `{ANCHOR}`"
        )
    return out
