"""The rollout and selection policies' home: one module per technique, found by the
`policy:` tag its YAML model carries (`meg.policies`), behind two protocols
(`policies.base.Rollout`, `policies.base.Selection`).

The consumers ask these three functions and the protocols' members, never a policy's name:
the generate task (`tasks.rollout`: launch count, watch, speculation), the scoring task
(`tasks.scoring`: merged groups), the episode planner (`flows.orchestrator.planning`:
launch count, selector), the engine choice (`hf_only`) and `meg validate` (`problems`, handed
to `meg.validate` the way the reward and tool registries are).
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
