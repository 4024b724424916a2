"""Size limits (meg/sizes.py): exact sample counts without expanding an episode, and sizes
that would hang or exhaust memory refused before anything starts, naming the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from meg.errors import MEGError
from meg.expand import expand_episode
from meg.limits import MAX_NODES, MAX_STEP_SAMPLES
from meg.load import load_meg
from meg.sizes import episode_samples, step_samples_problem
from meg.spec import MEGSpec
from workloads import BUILTIN


def spec_of(doc: dict[str, Any], tmp_path: Any) -> MEGSpec:
    path = tmp_path / "meg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_meg(path, check_models=False)


def builtin(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load(BUILTIN[name].read_text()))


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_counts_equal_the_expansion_for_every_builtin(name: str, tmp_path: Any) -> None:
    spec = spec_of(builtin(name), tmp_path)
    expanded = {node: samples for node, (_, samples) in expand_episode(spec).counts().items()}
    assert episode_samples(spec) == expanded


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    ns=st.lists(st.integers(1, 3), min_size=2, max_size=4),
    rules=st.lists(st.sampled_from(["per_sample", "all", "first", "best"]), min_size=3),
)
def test_counts_equal_the_expansion_for_random_chains(ns: list[int], rules: list[str]) -> None:
    """A chain a → b → c ... where each node also sees the first node under some rule."""
    nodes: dict[str, Any] = {}
    for i, n in enumerate(ns):
        inputs = {f"x{i - 1}": rules[i % len(rules)]} if i else {}
        if i >= 2:
            inputs["x0"] = rules[(i + 1) % len(rules)]
        if sum(r == "per_sample" for r in inputs.values()) > 1:
            inputs["x0"] = "all"
        nodes[f"x{i}"] = {"agent": "a", "template": "{question}", "n": n, "inputs": inputs}
    spec = MEGSpec.model_validate(
        {"name": "chain", "agents": {"a": {"model": "m"}}, "nodes": nodes}
    )
    expanded = {node: samples for node, (_, samples) in expand_episode(spec).counts().items()}
    assert episode_samples(spec) == expanded


def test_the_step_limit_is_exact(tmp_path: Any) -> None:
    spec = spec_of(builtin("math-chain"), tmp_path)
    per_episode = sum(episode_samples(spec).values())
    at_limit = MAX_STEP_SAMPLES // per_episode
    assert step_samples_problem(spec, at_limit) is None
    problem = step_samples_problem(spec, at_limit + 1)
    assert problem is not None and f"{(at_limit + 1) * per_episode:,} samples" in problem


def test_a_chain_of_big_groups_is_refused_naming_the_field(tmp_path: Any) -> None:
    doc = builtin("fanout")
    for node in ("plan", "work_s", "aggregate"):
        doc["nodes"][node]["n"] = 1000  # each one alone is fine; chained: 10^6 an episode
    with pytest.raises(MEGError, match="one step would generate") as e:
        spec_of(doc, tmp_path)
    assert e.value.field == "run.episodes_per_step"
    assert "work_s 1,000,000" in str(e.value)


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        (("nodes", "work_s", "n"), 10**9, "nodes.work_s.n"),
        (("run", "window"), 10**12, "run.window"),
        (("run", "episodes_per_step"), 10**12, "run.episodes_per_step"),
        (("dataset", "train_size"), 10**12, "dataset.train_size"),
    ],
)
def test_absurd_sizes_are_refused_naming_the_field(
    where: tuple[str, ...], value: int, field: str, tmp_path: Any
) -> None:
    doc = builtin("fanout")
    parent = doc
    for key in where[:-1]:
        parent = parent.setdefault(key, {})
    parent[where[-1]] = value
    with pytest.raises(MEGError) as e:
        spec_of(doc, tmp_path)
    assert e.value.field == field


def test_an_exchange_is_not_unrolled_past_the_node_limit(tmp_path: Any) -> None:
    doc = builtin("debate")
    (ex,) = doc["exchanges"].values()
    ex["rounds"] = 10**9  # unrolling this would never return
    with pytest.raises(MEGError) as e:
        spec_of(doc, tmp_path)
    assert e.value.field is not None and e.value.field.endswith(".rounds")
    ex["rounds"] = 100
    agents = [f"a{i}" for i in range(MAX_NODES // 100 + 1)]
    ex["agents"] = agents
    doc["agents"] |= {a: {"model": "m"} for a in agents}
    with pytest.raises(MEGError, match=r"unroll into 1,\d{3} nodes") as e:
        spec_of(doc, tmp_path)
    assert e.value.field == "exchanges"


def test_context_problems_count_every_shown_sample(tmp_path: Any) -> None:
    from meg.sizes import context_problems

    spec = spec_of(builtin("fanout"), tmp_path)
    contexts = dict.fromkeys(spec.agents, 10**6)
    assert context_problems(spec, contexts) == []
    assert context_problems(spec, {}) == []  # unknown contexts: nothing is claimed
    # the aggregator shows several worker samples: find its need, then one token less context
    (field, why), *_ = context_problems(spec, {**contexts, "aggregator": 2})
    assert field == "nodes.aggregate.inputs" and "agent 'aggregator' has a 2-token context" in why
    need = int(why.split("can reach ")[1].split(" tokens")[0].replace(",", ""))
    assert context_problems(spec, {**contexts, "aggregator": need + 1}) == []
    assert context_problems(spec, {**contexts, "aggregator": need})[0][0] == field
    # a producer's samples count at most what its own context leaves: max_tokens - 1
    # (and work_s, short's own node, now cannot show the plan in 2 tokens)
    short = {**contexts, "aggregator": need, "short": 2}
    assert [f for f, _ in context_problems(spec, short)] == ["nodes.work_s.inputs"]
