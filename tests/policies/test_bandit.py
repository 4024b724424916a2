"""The contextual rollout bandit (`select: {policy: bandit}`): its LinUCB and choice rule
(pure), and the selector on a real store's history — as many rollouts as planned, the
informative prompts preferred and replayed, the same choices when re-planned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meg import build_spec, validate
from policies.bandit import LinUCB, TaskStats, choose, features
from tasks.context import RunContext
from tasks.refs import episode_id
from tests.policies.test_greso import FLAT, VARY, commit, fill, ids, plan, selector
from workloads import BUILTIN
from workloads.datasets import TaskItem
from workloads.rewards import known_rewards


def bandit_ctx(tmp_path: Path, **select: Any) -> RunContext:
    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    data["run"]["select"] = {"policy": "bandit", **select}
    spec = validate(build_spec(data), known_rewards=known_rewards(), check_models=False)
    return RunContext("bandit", f"file://{tmp_path}/store", spec)


def item(task: str) -> TaskItem:
    return TaskItem(task, "1+1", "2")


def test_linucb_ranks_the_prompts_that_taught_something_first() -> None:
    ucb = LinUCB(5, ridge=1.0, alpha=0.0)  # no bonus: the regression alone
    rich, flat = TaskStats(4, 3, 2.0), TaskStats(4, 0, 4.0)  # informative 3/4 vs 0/4
    for _ in range(20):
        ucb.update(features(rich), 1.0)
        ucb.update(features(flat), 0.0)
    s = ucb.scores(np.stack([features(rich), features(flat)]))
    assert s[0] > 0.5 > s[1]
    explore = LinUCB(5, ridge=1.0, alpha=1.0)
    explore.update(features(flat), 0.0)
    unseen = features(TaskStats())
    assert explore.scores(np.stack([unseen, features(flat)]))[0] > 0  # the bonus explores


@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=8),
    st.lists(st.floats(-5, 5), max_size=8),
    st.integers(0, 8),
)
def test_choose_keeps_the_count_caps_the_replays_and_keeps_planned_slots(
    planned_scores: list[float], pool_scores: list[float], replay: int
) -> None:
    planned = [f"p{i}" for i in range(len(planned_scores))]
    pool = [f"q{i}" for i in range(len(pool_scores))]
    score = dict(zip(planned + pool, planned_scores + pool_scores, strict=True))
    chosen = choose(planned, pool, score, replay)
    slots = [s for s, _ in chosen]
    assert slots == list(range(len(planned)))  # every slot filled once
    replayed = [t for _, t in chosen if t.startswith("q")]
    assert len(replayed) <= replay and len(set(replayed)) == len(replayed)
    for s, t in chosen:
        assert t.startswith("q") or t == planned[s]  # a planned prompt keeps its slot
    if replayed:  # a displaced planned prompt scored no higher than any replayed one
        displaced = [planned[s] for s, t in chosen if t != planned[s]]
        assert max(score[t] for t in displaced) <= min(score[t] for t in replayed)


def fill_clear(ctx: RunContext, steps: int) -> dict[str, str]:
    """`steps` steps in which tI1, tI2 always vary (informative) and tF1, tF2 never do."""
    task_of = {}
    kinds = {"tI1": VARY, "tI2": VARY, "tF1": FLAT, "tF2": FLAT}
    for s in range(steps):
        for node in ("solve", "verify"):
            groups = {}
            for i, (task, rewards) in enumerate(kinds.items()):
                groups[episode_id(s, i)] = [rewards]
                task_of[episode_id(s, i)] = task
            commit(ctx, s, node, groups)
    return task_of


def test_the_bandit_replays_informative_prompts_in_place_of_flat_ones(tmp_path: Path) -> None:
    """At step 6 a micro-batch planned with the two flat prompts takes back the two
    informative ones; the other keeps its never-seen prompt (the bonus: unknown)."""
    ctx = bandit_ctx(tmp_path, replay=1.0)
    task_of = fill_clear(ctx, 6)
    sel = selector(ctx, 1, task_of.get, item)
    kept, ref = sel.select(6, plan(6, ["tF1", "tF2"], ["tNew"]))
    assert [len(eps) for eps in kept] == [2, 1]  # as many rollouts as planned
    assert {t for _, t in ids(kept)[0]} == {"tI1", "tI2"} == set(ref.counts["replayed"])
    assert sorted(ref.skipped) == ["tF1", "tF2"] and ref.planned == 3
    assert [e for e, _ in ids(kept)[0]] == ["k6e0", "k6e1"]  # the planned episode ids
    assert ids(kept)[1] == [("k6e2", "tNew")]  # the pool was used up by the first
    half = selector(bandit_ctx(tmp_path, replay=0.5), 1, task_of.get, item)
    assert len(half.select(6, plan(6, ["tF1", "tF2"], ["tNew"]))[1].counts["replayed"]) == 1
    none = selector(bandit_ctx(tmp_path, replay=0.0), 1, task_of.get, item)
    kept0, ref0 = none.select(6, plan(6, ["tF1", "tF2"], ["tNew"]))
    assert ids(kept0) == ids(plan(6, ["tF1", "tF2"], ["tNew"])) and ref0.counts["replayed"] == ()


def test_no_history_changes_nothing_and_re_planning_gives_the_same_choices(
    tmp_path: Path,
) -> None:
    ctx = bandit_ctx(tmp_path)
    task_of = fill(ctx, range(3))
    planned = plan(3, ["tA", "tB", "tD", "tE"], ["tE", "tA"])
    fresh = selector(ctx, 1, task_of.get, item)
    assert fresh.select(0, plan(0, ["tA"]))[0] == plan(0, ["tA"])  # nothing to learn from yet
    first = selector(ctx, 1, task_of.get, item).select(3, planned)
    replan = selector(ctx, 1, task_of.get, item)  # a resumed run re-plans 1, 2 first
    for k in (1, 2):
        replan.select(k, plan(k, ["tD"]))
    assert replan.select(3, planned) == first
    fill(ctx, range(3, 4))  # the store runs ahead: step 3 is not history yet
    assert selector(ctx, 1, task_of.get, item).select(3, planned) == first


def test_the_expected_cost_is_a_prompts_mean_tokens_or_the_mean_of_those_seen() -> None:
    from policies.bandit import expected_cost

    stats = [TaskStats(2, 1, 1.0, 40), TaskStats(1, 1, 1.0, 10), TaskStats(), TaskStats(1, 0, 0, 0)]
    assert expected_cost(stats).tolist() == [20.0, 10.0, 10.0, 1.0]  # unseen: mean(20, 10, 0)
    assert expected_cost([TaskStats()]).tolist() == [1.0]  # no history at all
