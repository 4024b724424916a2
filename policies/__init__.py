"""The rollout and selection policies' home: one module per technique, found by the
`policy:` tag its YAML model carries (`meg.policies`), behind two protocols
(`policies.base.Rollout`, `policies.base.Selection`).

The consumers ask these three functions and the protocols' members, never a policy's name:
the generate task (`tasks.rollout`: launch count, watch, speculation), the scoring task
(`tasks.scoring`: merged groups), the episode planner (`flows.orchestrator.planning`:
launch count, selector), the engine choice (`hf_only`), a run's settings (`implied`: the loss
anchors a rollout policy's samples need) and `meg validate` (`problems`, handed to
`meg.validate` the way the reward and tool registries are).
"""

from __future__ import annotations

from typing import Any

from meg import MEGSpec
from meg.registry import Registry
from policies.base import ROLLOUTS, SELECTIONS, Problem, Rollout, Selection


def rollout_policy(spec: MEGSpec) -> Rollout[Any]:
    """The behaviour of `spec.run.rollout`."""
    model = spec.run.rollout
    return ROLLOUTS.get(model.policy)(model)


def selection_policy(spec: MEGSpec) -> Selection[Any]:
    """The behaviour of `spec.run.select`."""
    model = spec.run.select
    return SELECTIONS.get(model.policy)(model)


def problems(spec: MEGSpec, rewards: Registry[Any] | None = None) -> list[Problem]:
    """What is wrong with `spec` under its rollout and selection policies, as (field,
    message) pairs (`meg.validate(policy_problems=...)` raises the first)."""
    return [
        *rollout_policy(spec).problems(spec, rewards),
        *selection_policy(spec).problems(spec, rewards),
    ]


def implied(spec: MEGSpec) -> tuple[MEGSpec, dict[str, str], list[str]]:
    """`spec` with the loss anchor its rollout policy needs (`Rollout.anchors`) given to each
    agent that names none; the settings so decided (dotted path → "policy", for run.json's
    sources) and one line each for the user. An agent that names an anchor keeps it (and
    `problems` refuses it where it is not the one needed)."""
    needed = rollout_policy(spec).anchors(spec)
    agents, sources, notes = dict(spec.agents), dict[str, str](), list[str]()
    for name, anchor in needed.items():
        agent = agents[name]
        if "old_logprobs" in agent.loss.model_fields_set:
            continue
        loss = agent.loss.model_copy(update={"old_logprobs": anchor})
        agents[name] = agent.model_copy(update={"loss": loss})
        sources[f"agents.{name}.loss.old_logprobs"] = "policy"
        notes.append(
            f"agent {name}: loss anchor {anchor} (what the {spec.run.rollout.policy} rollout "
            "policy's samples need)"
        )
    return (spec.model_copy(update={"agents": agents}) if sources else spec), sources, notes
