"""SERA (`select: {policy: sera}`): the allocation (pure, with hypothesis), the selector on a
real store's history, the merged advantage groups of the scoring task, and `meg validate`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meg import build_spec, validate
from policies import problems, selection_policy
from policies.sera import (
    allocate,
    maxrl_kappa,
    mixed_chance,
)
from storage.schema import SampleBatch
from tasks.context import RunContext
from tasks.refs import episode_id
from tasks.scoring import group_keys, multiplicity
from tests.meg.agentic_graphs import load as agentic
from tests.meg.agentic_graphs import refused as agentic_refused
from tests.policies.conftest import load, refused
from tests.policies.test_greso import commit, ids, plan, selector
from workloads import BUILTIN
from workloads.datasets import TaskItem
from workloads.rewards import known_rewards


def sera_data(**select: Any) -> dict[str, Any]:
    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    data["run"]["select"] = {"policy": "sera", **select}
    return data


def sera_ctx(tmp_path: Path, advantage: str = "maxrl", **select: Any) -> RunContext:
    data = sera_data(**select)
    data["agents"]["solver"]["loss"]["advantage"] = advantage
    data["nodes"]["solve"]["n"] = 2
    spec = validate(build_spec(data), known_rewards=known_rewards(), check_models=False)
    return RunContext("sera", f"file://{tmp_path}/store", spec)


@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
    st.integers(1, 4),
    st.integers(1, 6),
    st.floats(0.0, 0.5),
    st.sampled_from([mixed_chance, maxrl_kappa]),
    st.data(),
)
def test_allocation_spends_the_budget_and_equalizes_kappa(
    rates: list[float], n: int, max_episodes: int, min_mixed: float, kappa: Any, data: Any
) -> None:
    slots = data.draw(st.integers(1, len(rates) * max_episodes))
    units = allocate(rates, slots, n, max_episodes, min_mixed, kappa)
    assert sum(units) == slots and all(0 <= u <= max_episodes for u in units)
    assert sum(u > 0 for u in units) >= math.ceil(slots / max_episodes)
    # max-min: no episode could move from a prompt to another one whose κ is lower
    for q, uq in enumerate(units):
        for r, ur in enumerate(units):
            if uq >= 2 and 0 < ur < max_episodes:
                assert kappa(rates[q], (uq - 1) * n) <= kappa(rates[r], ur * n) + 1e-12


def test_the_hard_prompt_gets_the_most_and_the_settled_ones_none() -> None:
    assert allocate([0.1, 0.5, 0.9], 9, 2, 8, 0.05, maxrl_kappa) == [6, 2, 1]
    # never solved or always solved (p = 0 or 1): no group of theirs can teach anything
    assert allocate([0.0, 1.0, 0.3, 0.6], 8, 2, 8, 0.05, maxrl_kappa)[:2] == [0, 0]
    # too few prompts can teach: the most promising are kept to spend the budget
    assert sum(u > 0 for u in allocate([0.0, 1.0, 0.0, 1.0], 8, 2, 4, 0.05)) == 2
    assert allocate([0.5] * 4, 8, 2, 8, 0.05) == [2, 2, 2, 2]  # no information: uniform
    assert allocate([], 4, 2, 8, 0.05) == [] and allocate([0.5], 0, 2, 8, 0.05) == [0]


def item(task: str) -> TaskItem:
    return TaskItem(task, "1+1", "2")


def fill_sera(ctx: RunContext, steps: int) -> dict[str, str]:
    """`steps` steps in which the solver's groups of tHard are mostly wrong, tEasy's right,
    tMid's half right (the verifier's rows do not enter SERA's estimates)."""
    task_of: dict[str, str] = {}
    solve = {"tHard": [0.0, 0.0, 0.0, 1.0], "tEasy": [1.0, 1.0, 1.0, 1.0], "tMid": [0.0, 1.0]}
    for s in range(steps):
        groups: dict[str, list[list[float]]] = {}
        for i, (task, rewards) in enumerate(solve.items()):
            groups[episode_id(s, i)] = [rewards]
            task_of[episode_id(s, i)] = task
        commit(ctx, s, "solve", groups)
        commit(ctx, s, "verify", {e: [[0.0, 1.0]] for e in groups})
    return task_of


def test_the_selector_gives_the_hard_prompt_the_most_episodes(tmp_path: Path) -> None:
    ctx = sera_ctx(tmp_path)
    task_of = fill_sera(ctx, 3)
    sel = selector(ctx, 1, task_of.get, item)
    planned = plan(3, ["tHard", "tEasy", "tMid", "tX", "tY", "tZ"], ["tNew", "tEasy"])
    out, ref = sel.select(3, planned)
    mb0 = [t for _, t in ids(out)[0]]
    assert [e for e, _ in ids(out)[0]] == [episode_id(3, i) for i in range(6)]  # slot ids kept
    assert set(mb0) == {"tHard", "tEasy", "tMid"}  # ceil(6 / base 2) prompts share 6 episodes
    assert mb0.count("tHard") > mb0.count("tMid") > mb0.count("tEasy") >= 1
    assert ref.counts["repeated"].count("tHard") == mb0.count("tHard") - 2 and ref.planned == 3 + 1
    assert [t for _, t in ids(out)[1]] == ["tNew", "tNew"]  # one prompt, both episodes
    again = selector(ctx, 1, task_of.get, item)  # a resumed run re-plans the same
    for k in (1, 2):
        again.select(k, plan(k, ["tA", "tB"]))
    assert again.select(3, planned) == (out, ref)


def test_no_history_divides_the_episodes_evenly(tmp_path: Path) -> None:
    sel = selector(sera_ctx(tmp_path), 1, {}.get, item)
    out, ref = sel.select(0, plan(0, ["tA", "tB", "tC", "tD"]))
    assert [t for _, t in ids(out)[0]] == ["tA", "tA", "tB", "tB"]
    assert ref.skipped == () and ref.counts["repeated"] == ()


def batch(rows: list[tuple[str, str, int]]) -> SampleBatch:
    """Rows (episode, node, step) of one invocation each."""
    return SampleBatch.from_rows(
        [
            {
                "sample_id": f"{e}/{node}/0/{i}",
                "group_id": f"{e}/{node}/0",
                "node": node,
                "episode": e,
                "step": step,
                "policy_version": step,
                "prompt_ids": [1],
                "response_ids": [2],
                "logprobs": [-1.0],
            }
            for i, (e, node, step) in enumerate(rows)
        ]
    )


def test_a_prompts_episodes_are_one_group_for_the_root_only(tmp_path: Path) -> None:
    ctx = sera_ctx(tmp_path)
    episodes = ((episode_id(3, 0), item("tA")), (episode_id(3, 1), item("tA")))
    episodes += ((episode_id(3, 2), item("tB")),)
    solve = batch([(e, "solve", 3) for e, _ in episodes for _ in range(2)])
    keys = group_keys(ctx, "solve", solve, episodes)
    assert keys.tolist() == ["3/tA/solve"] * 4 + ["3/tB/solve"] * 2
    # base 2: a prompt at the mean (2 episodes) weighs 1, one with a single episode 2
    assert multiplicity(keys, solve.episode, 2).tolist() == [1.0] * 4 + [2.0] * 2
    verify = batch([(e, "verify", 3) for e, _ in episodes])  # it reads a solver sample
    assert np.array_equal(group_keys(ctx, "verify", verify, episodes), verify.group_id)
    plain = RunContext("p", ctx.store_url, ctx.spec.with_run(select={"policy": "all"}))
    assert np.array_equal(group_keys(plain, "solve", solve, episodes), solve.group_id)


def test_sera_merges_root_groups_and_is_refused_where_it_cannot_act(
    base: dict[str, Any], tmp_path: Path, loop: dict[str, Any]
) -> None:
    base["run"] = {"select": {"policy": "sera", "base": 3}}
    select = selection_policy(load(base, tmp_path))
    assert select.merges_groups and select.mean_episodes == 3 and select.needs_history
    base["rewards"] = {"y": {"fn": "exact_answer"}}  # the root x has no reward
    err = refused(base, tmp_path)
    assert err.field == "run.select" and "alone (x) from their rewards, and none has" in str(err)


def test_sera_refuses_a_loop(loop: dict[str, Any]) -> None:
    loop["run"] = {"select": {"policy": "sera"}}
    err = agentic_refused(loop, policy_problems=problems)
    assert err.field == "run.select"
    assert "sera selection policy merges the groups" in str(err) and "turn credit" in str(err)
    assert "`select: {policy: all}` with loops" in str(err)  # a policy that exists
    loop["run"] = {"select": {"policy": "all"}}
    assert agentic(loop, policy_problems=problems).run.select.policy == "all"


def test_sera_takes_a_top_level_tool(plain: dict[str, Any]) -> None:
    plain["run"] = {"select": {"policy": "sera"}}
    spec = agentic(plain, policy_problems=problems)
    assert selection_policy(spec).merges_groups  # no loop: no turn credit to break
