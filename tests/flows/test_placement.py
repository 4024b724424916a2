"""The run's placement object driven as the pipeline drives it (no cluster): the balancer's
decisions are said in the run's log."""

from __future__ import annotations

import logging

import pytest

from flows.cluster.start import Workers
from flows.orchestrator.placement import Placement, host_worker
from meg import load_meg
from tasks.context import Timing
from workloads import BUILTIN
from workloads.rewards import known_rewards

SECONDS = {"planner": 0.1, "short": 0.1, "medium": 0.1, "long": 2.0, "aggregator": 0.1}


def steps(place: Placement, n: int, mbs: int = 2) -> None:
    """`n` steps of fanout's generate tasks, the long worker's 20× the others'."""
    for k in range(n):
        place.expect_generates(k, mbs * len(SECONDS))
        for j in range(mbs):
            for agent, seconds in SECONDS.items():
                host = place.rollout_host(agent, 64)
                start = 10.0 * k
                timing = Timing("generate", agent, k, j, host_worker(host), start, start + seconds)
                place.generated(host, 64, agent, timing)


def test_a_new_split_is_said_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    spec = load_meg(BUILTIN["fanout"], known_rewards=known_rewards(), check_models=False)
    workers = Workers("tcp://s", ("R0", "R1"), ("T",), {})
    place = Placement(spec, workers, balance=True)
    assert {a: len(place.balancer.hosts_of(a)) for a in SECONDS}["long"] == 1  # 6 hosts, 5 agents
    with caplog.at_level(logging.INFO, logger="flows.orchestrator.placement"):
        steps(place, 1)
    assert len(place.balancer.hosts_of("long")) == 2  # the spare host went to the slow agent
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "rollout balancer after step 0: engines per agent "
        "planner 1, short 1, medium 1, long 2, aggregator 1"
    ]


def test_no_balancing_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    spec = load_meg(BUILTIN["fanout"], known_rewards=known_rewards(), check_models=False)
    place = Placement(spec, Workers("tcp://s", ("R0", "R1"), ("T",), {}), balance=False)
    with caplog.at_level(logging.INFO, logger="flows.orchestrator.placement"):
        steps(place, 3)
    assert caplog.records == []
