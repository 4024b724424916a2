"""The balancer as a pure policy: skewed traces, hysteresis, intra-agent placement."""

from __future__ import annotations

import pytest

from engines.rollout.balancer import (
    BalancerConfig,
    HierarchicalBalancer,
    NoBalancing,
    dhondt,
    equal_split,
    load_ratio,
)

AGENTS = ["planner", "solver", "verifier"]
HOSTS = [f"h{i}" for i in range(6)]
SKEW = {"planner": 100, "solver": 800, "verifier": 200}  # decode tokens per step, 1:8:2


def run_steps(bal: HierarchicalBalancer, demands: list[dict[str, int]]) -> list[bool]:
    changed = []
    for d in demands:
        for agent, tokens in d.items():
            bal.observe(agent, tokens)
        changed.append(bal.end_step())
    return changed


def test_equal_split_and_its_errors() -> None:
    assert equal_split(AGENTS, HOSTS) == {
        "planner": ("h0", "h3"),
        "solver": ("h1", "h4"),
        "verifier": ("h2", "h5"),
    }
    with pytest.raises(ValueError, match="2 hosts for 3 agents"):
        equal_split(AGENTS, ["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        equal_split(["a", "a"], HOSTS)


def test_dhondt_minimizes_the_largest_per_host_load() -> None:
    assert dhondt({"a": 8.0, "b": 2.0, "c": 1.0}, 6) == {"a": 4, "b": 1, "c": 1}
    assert dhondt({"a": 8.0, "b": 2.0, "c": 1.0}, 3) == {"a": 1, "b": 1, "c": 1}
    assert dhondt({"a": 1.0, "b": 1.0}, 4) == {"a": 2, "b": 2}
    assert load_ratio({"a": 8.0, "b": 2.0, "c": 1.0}, {"a": 4, "b": 1, "c": 1}) == 2.0


def test_skewed_demand_moves_hosts_to_the_heavy_agent_once() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    assert bal.counts() == {"planner": 2, "solver": 2, "verifier": 2}
    changed = run_steps(bal, [SKEW] * 6)
    assert changed == [True, False, False, False, False, False]
    assert bal.counts() == {"planner": 1, "solver": 4, "verifier": 1}
    # minimal moves: the solver kept its two hosts, others each gave one up
    assert {"h1", "h4"} <= set(bal.hosts_of("solver"))
    assert sorted(h for a in AGENTS for h in bal.hosts_of(a)) == HOSTS


def test_balanced_demand_never_rebalances() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    assert run_steps(bal, [dict.fromkeys(AGENTS, 300)] * 5) == [False] * 5


def test_hysteresis_prevents_flapping_near_a_boundary() -> None:
    # with 4 hosts the 4th goes to solver or verifier, whose demands cross every step
    hosts = HOSTS[:4]
    trace = [{"planner": 100, "solver": 520 if i % 2 else 480, "verifier": 500} for i in range(12)]
    eager = HierarchicalBalancer(
        AGENTS, hosts, BalancerConfig(ema=1.0, threshold=1.0, min_gain=0.0, cooldown_steps=0)
    )
    run_steps(eager, trace)
    calm = HierarchicalBalancer(AGENTS, hosts)  # defaults: EMA, 1.5×, 10% gain, cooldown
    run_steps(calm, trace)
    assert eager.changes >= 10  # without hysteresis the split flips with the noise
    assert calm.changes <= 1


def test_demand_shift_is_followed() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    run_steps(bal, [SKEW] * 4)
    assert bal.counts()["solver"] == 4
    run_steps(bal, [{"planner": 800, "solver": 100, "verifier": 200}] * 6)
    assert bal.counts()["planner"] == 4 and bal.counts()["solver"] == 1


def test_place_picks_fewest_outstanding_and_complete_releases() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    first = bal.place("solver", 100)
    second = bal.place("solver", 10)
    assert {first, second} == {"h1", "h4"}
    assert bal.place("solver", 5) == second  # 10 + 5 < 100
    bal.complete(first, 100)
    assert bal.place("solver", 1) == first
    with pytest.raises(KeyError, match="unknown agent 'critic'"):
        bal.place("critic", 1)
    with pytest.raises(KeyError, match="unknown host"):
        bal.complete("h99", 1)


def test_no_balancing_is_static_round_robin() -> None:
    off = NoBalancing(AGENTS, HOSTS)
    for _ in range(5):
        off.observe("solver", 800)
        assert off.end_step() is False
    assert [off.place("solver", 1000) for _ in range(4)] == ["h1", "h4", "h1", "h4"]
    assert off.hosts_of("planner") == ("h0", "h3")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="ema must be in"):
        BalancerConfig(ema=0)
    with pytest.raises(ValueError, match="threshold must be >= 1"):
        BalancerConfig(threshold=0.5)
