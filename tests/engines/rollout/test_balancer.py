"""The balancer as a pure policy: measured seconds in, host splits out, judged by a step model
and then by measurement; intra-agent placement."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import pytest

from engines.rollout.balancer import (
    BalancerConfig,
    Demand,
    HierarchicalBalancer,
    NoBalancing,
    equal_split,
)
from engines.rollout.step_model import rollout_makespan

AGENTS = ["planner", "solver", "verifier"]
HOSTS = [f"h{i}" for i in range(6)]
TASKS = 8  # generate tasks per agent and step (micro-batches × nodes)
SKEW = {"planner": 100.0, "solver": 800.0, "verifier": 200.0}  # seconds per step, 1:8:2

World = Callable[[Mapping[str, int]], dict[str, list[tuple[float, float]]]]


def independent(seconds: Mapping[str, float], tasks: int = TASKS) -> World:
    """Agents that read nobody: each runs `tasks` equal tasks in whole rounds on its hosts."""

    def run(counts: Mapping[str, int]) -> dict[str, list[tuple[float, float]]]:
        out = {}
        for agent, total in seconds.items():
            d = total / tasks
            out[agent] = [
                ((i // counts[agent]) * d, (i // counts[agent] + 1) * d) for i in range(tasks)
            ]
        return out

    return run


def run_steps(bal: HierarchicalBalancer, world: World, steps: int, first: int = 0) -> list[bool]:
    """Each step: the tasks `world` runs on the balancer's current split, then `end_step`."""
    changed = []
    for k in range(first, first + steps):
        for agent, spans in world(bal.counts()).items():
            for start, end in spans:
                bal.observe(agent, start, end, k)
        changed.append(bal.end_step(k))
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


def test_the_step_model_runs_tasks_in_rounds_along_the_graph() -> None:
    d = {"a": Demand(400, 4), "b": Demand(40, 4)}
    alone = {"a": (), "b": ()}
    # independent: 4 tasks of 100 s take 2 rounds on 2 hosts and on 3, 1 round on 4
    assert rollout_makespan(["a", "b"], alone, d, {"a": 2, "b": 1}) == 200
    assert rollout_makespan(["a", "b"], alone, d, {"a": 3, "b": 1}) == 200
    assert rollout_makespan(["a", "b"], alone, d, {"a": 4, "b": 1}) == 100
    # a chain a -> b: micro-batch i of b after micro-batch i of a; b's last ends 10 s after a's
    assert rollout_makespan(["a", "b"], {"b": ("a",)}, d, {"a": 4, "b": 1}) == 140
    assert rollout_makespan(["a", "b"], {"b": ("a",)}, d, {"a": 2, "b": 2}) == 210


def test_in_a_chain_short_agents_keep_their_hosts() -> None:
    """The simulator's finding: a 15-agent chain ran 5-15% slower when the split minimized
    the largest per-agent load, taking hosts from short agents every micro-batch waits for.
    Scored by the step model, the equal split stays."""
    chain = ["long", "medium", "short"]
    bal = HierarchicalBalancer(chain, HOSTS, parents={"medium": ("long",), "short": ("medium",)})
    bal.demand = {"long": Demand(320, 4), "medium": Demand(148, 4), "short": Demand(48, 4)}
    equal = bal.counts()
    minmax = {"long": 4, "medium": 1, "short": 1}  # the largest per-agent load: 80 s not 160 s
    assert bal.step_seconds(minmax) >= bal.step_seconds(equal) * 0.9
    assert bal._search(equal) is None


def test_skewed_demand_moves_hosts_to_the_heavy_agent_and_keeps_them() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    assert bal.counts() == {"planner": 2, "solver": 2, "verifier": 2}
    changed = run_steps(bal, independent(SKEW), 10)
    assert changed.count(True) == 1 and bal.reverts == 0 and bal.trial is None
    assert bal.counts() == {"planner": 1, "solver": 4, "verifier": 1}
    # minimal moves: the solver kept its two hosts, the others each gave one up
    assert {"h1", "h4"} <= set(bal.hosts_of("solver"))
    assert sorted(h for a in AGENTS for h in bal.hosts_of(a)) == HOSTS


def test_a_split_measured_worse_than_before_is_undone_and_never_tried_again() -> None:
    """A world the model gets wrong: any split but the equal one doubles every task (say, the
    moved hosts thrash). The trial measures it, goes back, and rejects that split."""
    skewed = independent(SKEW)

    def thrashing(counts: Mapping[str, int]) -> dict[str, list[tuple[float, float]]]:
        slow = 1.0 if all(c == 2 for c in counts.values()) else 2.0
        return {a: [(s * slow, e * slow) for s, e in v] for a, v in skewed(counts).items()}

    bal = HierarchicalBalancer(AGENTS, HOSTS)
    changed = run_steps(bal, thrashing, 16)
    assert changed.count(True) == 2  # tried once, undone once
    assert bal.reverts == 1 and bal.counts() == dict.fromkeys(AGENTS, 2)
    assert (1, 4, 1) in bal.rejected


def test_balanced_demand_never_rebalances() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    assert run_steps(bal, independent(dict.fromkeys(AGENTS, 300.0)), 5) == [False] * 5


def test_a_small_modelled_gain_is_not_worth_a_move() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS[:4])  # the 4th host: planner's second
    assert not any(
        run_steps(bal, independent({"planner": 100, "solver": 210, "verifier": 200}, 2), 6)
    )
    eager = HierarchicalBalancer(AGENTS, HOSTS[:4], BalancerConfig(min_gain=0.0, cooldown_steps=0))
    assert any(
        run_steps(eager, independent({"planner": 100, "solver": 210, "verifier": 200}, 2), 6)
    )


def test_demand_shift_is_followed() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    run_steps(bal, independent(SKEW), 8)
    assert bal.counts()["solver"] == 4
    run_steps(bal, independent({"planner": 800, "solver": 100, "verifier": 200}), 12, first=8)
    assert bal.counts()["planner"] == 4 and bal.counts()["solver"] == 1


def test_steps_are_kept_apart() -> None:
    """A task of the next step that finishes early is folded with its own step."""
    bal = HierarchicalBalancer(["a", "b"], HOSTS[:4])
    for i in range(4):
        bal.observe("a", 10.0 * i, 10.0 * (i + 1), step=0)
    bal.observe("a", 0.0, 99.0, step=1)  # step 1 already running
    bal.end_step(0)
    assert bal.demand["a"] == Demand(40.0, 4)
    assert bal.span == 40.0  # first start to last end of step 0
    bal.end_step(1)
    assert bal.demand["a"] == Demand(0.5 * 99.0 + 0.5 * 40.0, 0.5 * 1 + 0.5 * 4)
    with pytest.raises(ValueError, match="before it starts"):
        bal.observe("a", 5.0, 1.0)


def test_a_tool_task_spans_the_step_but_adds_no_demand() -> None:
    """A tool node's seconds are the environment's (the reward processes), so they widen
    the step's span without asking its agent's engines for more hosts."""
    bal = HierarchicalBalancer(["a", "b"], HOSTS[:4])
    bal.observe("a", 0.0, 10.0, step=0)
    bal.observe("a", 10.0, 500.0, step=0, demand=False)  # run_tests, 490 s
    bal.observe("b", 0.0, 10.0, step=0)
    bal.end_step(0)
    assert bal.demand["a"] == bal.demand["b"] == Demand(10.0, 1)
    assert bal.span == 500.0
    # a step of only tool tasks leaves the estimate where it was
    bal.observe("a", 0.0, 7.0, step=1, demand=False)
    bal.end_step(1)
    assert bal.demand["a"] == Demand(10.0, 1)


def test_parents_must_come_first() -> None:
    with pytest.raises(ValueError, match="must come before"):
        HierarchicalBalancer(["a", "b"], HOSTS, parents={"a": ("b",)})


def test_place_takes_turns_unless_a_host_is_a_task_behind() -> None:
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    assert [bal.place("solver", 100) for _ in range(4)] == ["h1", "h4", "h1", "h4"]
    bal.complete("h4", 100)
    bal.complete("h4", 100)  # h4 idle, h1 two tasks behind: h1's turn goes to h4
    assert bal.place("solver", 100) == "h4"
    bal.outstanding["h1"] = 150  # less than a task more than h4's 100: turns hold
    assert bal.place("solver", 100) == "h4" and bal.place("solver", 100) == "h1"
    with pytest.raises(KeyError, match="unknown agent 'critic'"):
        bal.place("critic", 1)
    with pytest.raises(KeyError, match="unknown host"):
        bal.complete("h99", 1)


def test_no_balancing_is_static_round_robin() -> None:
    off = NoBalancing(AGENTS, HOSTS)
    for k in range(5):
        off.observe("solver", 0.0, 800.0, k)
        assert off.end_step(k) is False
    assert [off.place("solver", 1000) for _ in range(4)] == ["h1", "h4", "h1", "h4"]
    assert off.hosts_of("planner") == ("h0", "h3")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="ema must be in"):
        BalancerConfig(ema=0)
    with pytest.raises(ValueError, match="min_gain"):
        BalancerConfig(min_gain=1.0)
    with pytest.raises(ValueError, match="trial_steps"):
        BalancerConfig(trial_steps=0)
    assert math.isclose(BalancerConfig().min_gain, 0.1)


def test_the_step_model_maps_tasks_between_agents_of_different_counts() -> None:
    """LoRA agents sharing a base are one unit with the tasks of all their nodes: a child
    unit with fewer tasks waits for the parent's task at the same position (the debate's
    `alice+bob` unit runs 8 tasks a step, its judge 4)."""
    d = {"pair": Demand(80, 8), "judge": Demand(40, 4)}
    parents = {"judge": ("pair",)}
    # judge's task i waits for pair's task 2i: the last (i=3) waits for pair's 7th at 80 s
    assert rollout_makespan(["pair", "judge"], parents, d, {"pair": 1, "judge": 1}) == 90
    assert rollout_makespan(["pair", "judge"], parents, d, {"pair": 2, "judge": 1}) == 50


def starting_engines(
    bal: HierarchicalBalancer, seconds: Mapping[str, float], load: float, steps: int
) -> None:
    """`steps` steps of `independent(seconds)` as the pipeline runs them: step k is placed on
    the split the balancer had `window` steps before (steps in flight keep theirs), and a
    host's first task for an agent first starts that agent's engine (`load` seconds, reported
    as `startup`), which delays the host's later tasks of the step too."""
    world = independent(seconds)
    window = bal.config.window
    placed = [bal.assignment] * (window + 1)  # placed[k]: the split step k runs on
    started: set[tuple[str, str]] = set()
    for k in range(steps):
        split = placed[k]
        counts = {a: len(hs) for a, hs in split.items()}
        for agent, spans in world(counts).items():
            late: dict[str, float] = {}  # host → its engine start so far this step
            for i, (start, end) in enumerate(spans):
                host = split[agent][i % counts[agent]]
                startup = 0.0 if (host, agent) in started else load
                started.add((host, agent))
                late[host] = late.get(host, 0.0) + startup
                shift = late[host] - startup
                bal.observe(agent, start + shift, end + late[host], k, startup=startup)
        bal.end_step(k)
        placed.append(bal.assignment)


def test_an_engine_start_does_not_count_against_a_new_split() -> None:
    """The solver's new hosts start its engine once (500 s, more than the better split saves
    over a trial's two steps: 400 s a step become 200 s). Measured warm, the better split is
    kept after one change. Counted (the code before this test), the first step's starts
    skewed the demand into a detour through (1, 3, 2), and the trial of (1, 4, 1) measured
    its start (700 s) and undid it for good."""
    bal = HierarchicalBalancer(AGENTS, HOSTS)
    starting_engines(bal, SKEW, 500.0, 14)
    assert bal.counts() == {"planner": 1, "solver": 4, "verifier": 1}
    assert bal.reverts == 0 and bal.trial is None and bal.changes == 1
    assert bal.demand["solver"] == Demand(800.0, 8)  # the start is nobody's demand
    assert bal.span == 200.0


def test_the_run_s_first_step_starts_every_engine_and_sets_no_span() -> None:
    bal = HierarchicalBalancer(["a", "b"], HOSTS[:2])
    bal.observe("a", 0.0, 70.0, step=0, startup=60.0)
    bal.observe("b", 0.0, 15.0, step=0, startup=5.0)
    assert bal.end_step(0) is False
    assert bal.span is None and bal.demand == {"a": Demand(10.0, 1), "b": Demand(10.0, 1)}
    bal.observe("a", 0.0, 10.0, step=1)
    bal.observe("b", 0.0, 10.0, step=1)
    bal.end_step(1)
    assert bal.span == 10.0
    with pytest.raises(ValueError, match="not within the task"):
        bal.observe("a", 0.0, 10.0, step=2, startup=11.0)
