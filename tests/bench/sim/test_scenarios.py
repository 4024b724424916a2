"""The paper's setting as MEGs and layouts: valid graphs without weights, layouts that use
and the accelerators they are given."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim.costs import profile
from bench.sim.scenarios import (
    BIG,
    SMALL,
    chain_meg,
    colocated,
    disaggregated,
    fanout_meg,
    routed_meg,
    routed_shares,
    whole_cluster,
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


def test_routed_skews_its_sub_agents_load_by_routing_share() -> None:
    spec = routed_meg(5).spec
    groups = [spec.nodes[f"n{i}"].n for i in range(5)]
    assert groups[0] == groups[-1] == 8  # router and aggregator: a full group
    assert groups[1] > groups[2] > groups[3] >= 1  # Zipf shares 1, 1/2, 1/3
    assert abs(sum(routed_shares(3)) - 1) < 1e-12
    assert set(spec.nodes["n4"].inputs) == {"n1", "n2", "n3"}


def test_the_mas_rl_like_layout_is_one_worker_of_every_accelerator() -> None:
    layout = whole_cluster(5, 768)
    assert layout.rollout == layout.train == ("cluster",)
    assert layout.total_accel == 768 and 1 <= layout.train_slots <= 5


def test_utilization_counts_only_the_replicas_that_decode() -> None:
    """The paper's utilization is the accelerators' active time: a generate task with fewer
    sequences than its worker has replicas keeps the others idle."""
    acc = profile("acc-64g")
    lengths, prompts = np.full(4, 1000), np.full(4, 100)
    few = acc.generate_active(SMALL, prompts, lengths, 64)  # 4 sequences, 32 replicas of tp 2
    many = acc.generate_active(SMALL, np.full(64, 100), np.full(64, 1000), 64)
    assert 0 < few < 0.2 < many <= 1
    assert profile("cpu-here").generate_active(SMALL, prompts, lengths, 1) == 1.0
