"""The policies' home: every policy a MEG can name has its behaviour, found by its tag, and
a MEG is checked by the policy it names."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from meg import build_spec
from meg.policies import AllPrompts, FullRollout, RolloutPolicy, SelectPolicy
from meg.registry import UnknownNameError
from policies import rollout_policy, selection_policy
from policies.base import ROLLOUTS, SELECTIONS, NodeRequests, Rollout, Selection
from tests.meg.conftest import BASE


def tags(union: Any) -> set[str]:
    models = get_args(get_args(union)[0])
    return {get_args(m.model_fields["policy"].annotation)[0] for m in models}


def test_every_model_tag_has_a_behaviour_and_no_behaviour_lacks_a_model() -> None:
    assert set(ROLLOUTS.names()) == tags(RolloutPolicy) == {
        "full", "april", "rollverify", "darts", "srt", "sparse", "external"
    }  # fmt: skip
    assert set(SELECTIONS.names()) == tags(SelectPolicy) == {"all", "greso", "bandit", "sera"}


def test_the_behaviour_wraps_the_run_s_own_model() -> None:
    spec = build_spec(
        {**BASE, "run": {"rollout": {"policy": "darts"}, "select": {"policy": "sera"}}}, "t"
    )
    rollout, select = rollout_policy(spec), selection_policy(spec)
    assert rollout.model is spec.run.rollout and select.model is spec.run.select
    assert type(rollout).__module__ == "policies.darts"
    assert type(select).__module__ == "policies.sera"


def test_the_baselines_change_nothing() -> None:
    rollout, select = Rollout(FullRollout()), Selection(AllPrompts())
    assert [rollout.launched(q) for q in range(5)] == [rollout.quota(q) for q in range(5)]
    assert rollout.launched(7) == 7 and rollout.speculation(64) is None
    assert rollout.kv_budget(64) is None
    assert rollout.watch(NodeRequests(4, [], None, str)) is None
    assert not select.needs_history and not select.merges_groups and select.mean_episodes == 1
    assert select.selector(None, 1, {}.get, {}.__getitem__) is None  # type: ignore[arg-type]


def test_an_unknown_tag_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"rollout policy.*april"):
        ROLLOUTS.get("partial")


def test_only_the_consumers_ask_for_a_policy_and_none_names_a_technique() -> None:
    """The product asks `policies` for a run's behaviour in a handful of places and never
    imports one technique's module: a new policy touches none of them."""
    from tests.test_import_graph import import_graph

    graph = import_graph()
    product = {m: t for m, t in graph.items() if not m.startswith(("policies", "bench"))}
    techniques = {m for m in graph if m.startswith("policies.") and m != "policies.base"}
    assert {m: t & techniques for m, t in product.items() if t & techniques} == {}
    askers = sorted(m for m, t in product.items() if "policies" in t)
    assert askers == [
        "flows.orchestrator.planning",  # launch counts, the selector
        "flows.runs.config",  # `meg validate`: the policies' problems
        "flows.runs.engine_choice",  # the agents only `hf` can serve
        "flows.runs.settle",  # a run's settings: the loss anchors a policy's samples need
        "tasks.rollout",  # watch, speculation, april's quota
        "tasks.scoring",  # merged advantage groups
    ]
