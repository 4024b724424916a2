"""The paper's setting as MEGs and layouts: valid graphs without weights, layouts that use
and the accelerators they are given."""

from __future__ import annotations

import pytest

from bench.sim.scenarios import (
    BIG,
    SMALL,
    chain_meg,
    colocated,
    disaggregated,
    fanout_meg,
)


@pytest.mark.parametrize("n", [1, 3, 15])
def test_paper_megs_validate_with_hub_models_and_one_node_per_agent(n: int) -> None:
    for sc in (chain_meg(n), fanout_meg(n)):
        assert len(sc.spec.agents) == len(sc.spec.nodes) == n
        assert {a.model for a in sc.spec.agents.values()} <= {BIG, SMALL}
        assert set(sc.lengths) == set(sc.spec.nodes) and sc.episodes // sc.micro_batches == 16


def test_fanout_reads_every_worker_into_the_aggregator() -> None:
    spec = fanout_meg(5).spec
    assert set(spec.nodes["n4"].inputs) == {"n1", "n2", "n3"}
    assert all(spec.nodes[f"n{i}"].inputs == {"n0": "best"} for i in (1, 2, 3))


@pytest.mark.parametrize(("n", "accel"), [(3, 768), (15, 768), (5, 64)])
def test_layouts_stay_within_their_accelerators(n: int, accel: int) -> None:
    d, c = disaggregated(n, accel), colocated(n, accel)
    assert len(d.rollout) >= n and d.total_accel <= accel and c.total_accel <= accel
    assert set(c.rollout) == set(c.train) and len(c.train) == n
    assert d.train_slots >= 1


def test_shared_training_workers_when_agents_outnumber_nodes_of_training() -> None:
    d = disaggregated(5, 64)  # 32 training accelerators: two shared workers of 16
    assert len(d.train) == 2 and {d.accel[w] for w in d.train} == {16} and d.train_slots == 1
