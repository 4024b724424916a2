"""Episode expansion against hand counts, lineage-scoped aggregation, and analysis."""

from __future__ import annotations

from typing import Any

import pytest

from meg import analyze, build_spec, expand_episode, validate
from meg.render import mermaid
from workloads import BUILTIN
from workloads.rewards import known_rewards


def load(name: str):  # type: ignore[no-untyped-def]
    from meg import load_meg

    return load_meg(BUILTIN[name], known_rewards=known_rewards(), check_models=False)


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        # counted by hand: (invocations, samples) per node for one episode
        ("math-chain", {"solve": (1, 8), "verify": (8, 16)}),
        (
            "debate",
            {
                "alice@1": (1, 2),
                "bob@1": (1, 2),
                "alice@2": (2, 4),
                "bob@2": (2, 4),
                "final": (1, 2),
            },
        ),
        (
            "fanout",
            {
                "plan": (1, 2),
                "work_s": (2, 4),
                "work_m": (2, 4),
                "work_l": (2, 4),
                "aggregate": (2, 4),
            },
        ),
    ],
)
def test_builtin_counts(workload: str, expected: dict[str, tuple[int, int]]) -> None:
    assert expand_episode(load(workload)).counts() == expected


def test_per_sample_chain_is_a_tree(base: dict[str, Any]) -> None:
    base["nodes"]["z"] = {"agent": "a", "template": "{y}", "n": 2, "inputs": {"y": "per_sample"}}
    exp = expand_episode(validate(build_spec(base)))
    assert exp.counts() == {"x": (1, 2), "y": (2, 4), "z": (4, 8)}
    ids = [s.id for s in exp.samples["z"]]
    assert len(set(ids)) == 8 and ids[0] == "e0/z/0/0"
    # every z sample descends from exactly one y and one x sample
    assert all(len(s.lineage) == 3 for s in exp.samples["z"])


def test_aggregate_sees_only_its_lineage() -> None:
    exp = expand_episode(load("fanout"))
    for plan in exp.invocations["aggregate"]:
        plan_sample = dict(plan.lineage)["plan"]
        shown = dict(plan.inputs)
        for worker in ("work_s", "work_m", "work_l"):
            (picked,) = shown[worker]  # best -> exactly one
            assert dict(picked.lineage)["plan"] == plan_sample


def test_all_rule_shows_every_compatible_sample(base: dict[str, Any]) -> None:
    base["nodes"]["z"] = {
        "agent": "a",
        "template": "{y}",
        "n": 1,
        "inputs": {"x": "per_sample", "y": "all"},
    }
    exp = expand_episode(validate(build_spec(base)))
    for plan in exp.invocations["z"]:
        ys = dict(plan.inputs)["y"]
        assert len(ys) == 2  # y ran twice... once per x sample; 2 samples each under this x
        x_id = dict(plan.lineage)["x"]
        assert all(dict(s.lineage)["x"] == x_id for s in ys)


def test_analysis_loads_and_critical_path() -> None:
    a = analyze(load("fanout"))
    by_agent = {al.agent: al for al in a.agents}
    assert by_agent["long"].decode_tokens == 4 * 64
    assert by_agent["short"].decode_tokens == 4 * 4
    assert a.critical_path == ("plan", "work_l", "aggregate")
    assert a.critical_decode_tokens == 4 + 64 + 6


def test_mermaid_has_every_node_and_edge() -> None:
    spec = load("debate")
    out = mermaid(spec)
    assert out.startswith("flowchart TD")
    for n in spec.nodes:
        assert f'["{n}<br/>' in out
    assert out.count("-->") == sum(len(n.inputs) for n in spec.nodes.values())
