"""Selective rollouts (`select: {policy: greso}`): which planned prompts a step rolls out,
decided from zero-variance history read back from a real store."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from meg import MEGSpec, build_spec, validate
from meg.policies import GresoSelect, keep_draw
from policies import selection_policy
from policies._history import zero_variance_episodes
from policies.base import Selector, SelectRef
from policies.greso import Greso
from storage.schema import SampleBatch, SegmentKey
from storage.store import MEGStore
from tasks.context import RunContext
from tasks.refs import Episode, episode_id
from workloads import BUILTIN
from workloads.datasets import TaskItem
from workloads.rewards import known_rewards


def selector(ctx: RunContext, window: int, task_of: Any, item_of: Any = None) -> Selector:
    """The run's selector, as the episode planner gets it (the policy's own factory)."""
    made = selection_policy(ctx.spec).selector(ctx, window, task_of, item_of)
    assert made is not None
    return made


NAN = math.nan
FLAT, VARY = [1.0, 1.0], [0.0, 1.0]
AGENT = {"solve": "solver", "verify": "verifier"}


def greso_spec(**select: Any) -> MEGSpec:
    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    data["run"]["select"] = {"policy": "greso", **select}
    return validate(build_spec(data), known_rewards=known_rewards(), check_models=False)


def commit(ctx: RunContext, step: int, node: str, groups: dict[str, list[list[float]]]) -> None:
    """Commit and score the rows of (step, micro-batch 0, node): per episode, its groups'
    rewards (one row per reward)."""
    rows, rewards = [], []
    for eid, gs in groups.items():
        for g, rs in enumerate(gs):
            for i, r in enumerate(rs):
                rows.append(
                    {
                        "sample_id": f"{eid}/{node}/{g}/{i}",
                        "group_id": f"{eid}/{node}/{g}",
                        "node": node,
                        "episode": eid,
                        "step": step,
                        "policy_version": step,
                        "prompt_ids": [1, 2],
                        "response_ids": [3],
                        "logprobs": [-1.0],
                    }
                )
                rewards.append(r)
    key = SegmentKey(step, 0, node)
    table = MEGStore.open(ctx.store_url, ctx.run_id).table(AGENT[node])
    ref = table.write_segment(key, SampleBatch.from_rows(rows))
    ids = [r["sample_id"] for r in rows]
    table.write_scores(key, ids, rewards, np.zeros(len(ids)))
    assert ref.rows == len(rows)


# step → task → (solve groups, verify groups); `episode_id(step, i)` is the i-th task listed
HISTORY: dict[int, dict[str, tuple[list[list[float]], list[list[float]]]]] = {
    0: {"tA": ([FLAT], [FLAT]), "tB": ([FLAT], [FLAT]), "tC": ([VARY], [FLAT])},
    1: {"tA": ([FLAT], [FLAT, FLAT]), "tB": ([VARY], [FLAT]), "tC": ([FLAT], [FLAT])},
    2: {
        "tA": ([[1.0, 1.0, NAN]], [FLAT]),  # NaN (unscored) rows are ignored
        "tB": ([FLAT], [FLAT]),
        "tC": ([FLAT], [FLAT, VARY]),  # one varying group of the verifier
        "tE": ([[0.0, 0.0]], [FLAT]),
    },
    3: {"tA": ([VARY], [FLAT]), "tB": ([VARY], [VARY])},  # not yet history at step 3
}
STREAKS_AT_3 = {"tA": 3, "tB": 1, "tC": 0, "tD": 0, "tE": 1}  # tD: never rolled out


def fill(ctx: RunContext, steps: range) -> dict[str, str]:
    task_of = {}
    for s in steps:
        for node in ("solve", "verify"):
            groups = {}
            for i, (task, by_node) in enumerate(HISTORY[s].items()):
                groups[episode_id(s, i)] = by_node[node == "verify"]
                task_of[episode_id(s, i)] = task
            commit(ctx, s, node, groups)
    return task_of


def new_ctx(tmp_path: Path, seed: int = 0, **select: Any) -> RunContext:
    spec = greso_spec(**{"explore": 0.001, "floor": 0.0, **select})
    return RunContext("sel", f"file://{tmp_path}/store", spec.with_run(seed=seed))


def plan(k: int, *mbs: list[str]) -> list[tuple[Episode, ...]]:
    """Micro-batches of step k's episodes, numbered in order, for the given task ids."""
    out, i = [], 0
    for tasks in mbs:
        out.append(
            tuple((episode_id(k, i + n), TaskItem(t, "1+1", "2")) for n, t in enumerate(tasks))
        )
        i += len(tasks)
    return out


def ids(mbs: list[tuple[Episode, ...]]) -> list[list[tuple[str, str]]]:
    return [[(e, item.id) for e, item in eps] for eps in mbs]


def test_zero_variance_episodes() -> None:
    # fmt: off
    rows = [  # (episode, group, reward)
        ("e1", "e1/a/0", 1.0), ("e1", "e1/a/0", 1.0), ("e1", "e1/b/0", 0.0), ("e1", "e1/b/0", 0.0),
        ("e2", "e2/a/0", 1.0), ("e2", "e2/a/0", 1.0), ("e2", "e2/a/1", 0.0), ("e2", "e2/a/1", 1.0),
        ("e3", "e3/a/0", 0.5), ("e3", "e3/a/0", NAN), ("e3", "e3/a/0", 0.5 + 5e-7),
        ("e4", "e4/a/0", NAN), ("e4", "e4/a/0", NAN),
        ("e5", "e5/a/0", 0.2), ("e5", "e5/a/0", NAN), ("e5", "e5/a/0", 0.3),
    ]
    # fmt: on
    e, g, r = (np.array(c) for c in zip(*rows, strict=True))
    flat = zero_variance_episodes(e, g, r.astype(np.float32))
    assert flat == {"e1": True, "e2": False, "e3": True, "e5": False}  # e4: nothing scored
    # the verdict of an episode does not depend on the order of its groups
    order = np.arange(len(rows))[::-1]
    assert zero_variance_episodes(e[order], g[order], r[order].astype(np.float32)) == flat
    assert zero_variance_episodes(np.array([]), np.array([]), np.array([])) == {}


def test_streaks_count_the_trailing_flat_episodes_of_every_rewarded_node(tmp_path: Path) -> None:
    ctx = new_ctx(tmp_path)
    task_of = fill(ctx, range(4))
    sel = selector(ctx, 1, task_of.get)
    assert sel.nodes == ["solve", "verify"]
    sel.select(3, plan(3, ["tD"]))
    assert sel.ingested == 2  # history only from steps <= k - window
    assert {t: sel.streak(t) for t in STREAKS_AT_3} == STREAKS_AT_3
    sel.select(4, plan(4, ["tD"]))  # now step 3 is history: tA and tB varied there
    assert sel.ingested == 3
    assert (sel.streak("tA"), sel.streak("tB"), sel.streak("tC")) == (0, 0, 0)
    # a wider window reads less: with window 2, step 3 plans from steps 0 and 1 only
    wide = selector(ctx, 2, task_of.get)
    wide.select(3, plan(3, ["tD"]))
    assert wide.ingested == 1 and (wide.streak("tA"), wide.streak("tB")) == (2, 0)


def test_flat_prompts_are_skipped_and_each_micro_batch_keeps_one(tmp_path: Path) -> None:
    ctx = new_ctx(tmp_path)
    task_of = fill(ctx, range(3))
    planned = plan(3, ["tA", "tD"], ["tB", "tE"], ["tC"])
    p = Greso(ctx.spec.run.select).rollout_probability(1)  # the highest for a flat task: 0.001
    assert all(keep_draw(ctx.seed, 3, i) >= p for i in range(5))  # so every flat one is skipped
    kept, ref = selector(ctx, 1, task_of.get).select(3, planned)
    # tA (streak 3) skipped; tD (never seen) kept; tB and tE both flat: the first is kept
    assert ids(kept) == [[("k3e1", "tD")], [("k3e2", "tB")], [("k3e4", "tC")]]
    assert ref == SelectRef(step=3, planned=5, counts={"skipped": ("tA", "tE")})


def test_selection_is_deterministic_and_the_same_when_re_planned(tmp_path: Path) -> None:
    ctx = new_ctx(tmp_path, explore=0.5, history=2)
    task_of = fill(ctx, range(3))
    planned = plan(3, ["tA", "tB", "tC", "tD", "tE"], ["tE", "tA", "tB"])
    first = selector(ctx, 1, task_of.get).select(3, planned)
    assert selector(ctx, 1, task_of.get).select(3, planned) == first  # a fresh selector
    replan = selector(ctx, 1, task_of.get)  # a resumed run re-plans its earlier steps first
    for k in (1, 2):
        replan.select(k, plan(k, ["tD"]))
    assert replan.select(3, planned) == first
    fill(ctx, range(3, 4))  # the store runs ahead (a resumed run): step 3 is not history yet
    assert selector(ctx, 1, task_of.get).select(3, planned) == first
    # each planned episode is kept iff its seeded draw is below its rollout probability
    policy = Greso(ctx.spec.run.select)
    expect = [
        [
            (eid, t.id)
            for eid, t in eps
            if keep_draw(0, 3, int(eid[3:])) < policy.rollout_probability(STREAKS_AT_3[t.id])
        ]
        for eps in planned
    ]
    assert all(expect) and ids(first[0]) == expect
    assert 0 < len(first[1].skipped) < first[1].planned  # the draws both keep and skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_draws_follow_the_run_seed(tmp_path: Path, seed: int) -> None:
    """Twelve prompts with streak 1 and explore 0.5: which are rolled out depends on the
    seed, and is exactly the seeded draws below 0.5."""
    ctx0, ctx = new_ctx(tmp_path, seed=0, explore=0.5), new_ctx(tmp_path, seed=seed, explore=0.5)
    task_of = fill(ctx, range(3))
    planned = plan(3, ["tE"] * 12)
    kept0, _ = selector(ctx0, 1, task_of.get).select(3, planned)
    kept, ref = selector(ctx, 1, task_of.get).select(3, planned)
    expect = [e for e, _ in planned[0] if keep_draw(seed, 3, int(e[3:])) < 0.5]
    assert 0 < len(expect) < 12 and [e for e, _ in kept[0]] == expect
    assert ref.skipped == ("tE",) * (12 - len(expect))
    assert ids(kept) != ids(kept0)


def test_greso_rollout_probability() -> None:
    def greso(**kw: Any) -> Greso:
        return Greso(GresoSelect(policy="greso", **kw))

    policy = greso(explore=0.5, floor=0.1, history=3)
    assert policy.rollout_probability(0) == 1.0  # never flat: always rolled out
    assert policy.rollout_probability(1) == 0.5
    assert policy.rollout_probability(2) == 0.25
    assert policy.rollout_probability(3) == pytest.approx(0.125)
    # 0.5 ** 4 = 0.0625 would be below the floor, but the streak is capped at `history`
    assert policy.rollout_probability(4) == policy.rollout_probability(3)
    assert policy.rollout_probability(50) == pytest.approx(0.125)
    low = greso(explore=0.5, floor=0.2, history=8)
    assert [low.rollout_probability(s) for s in range(5)] == [1.0, 0.5, 0.25, 0.2, 0.2]
    assert greso(explore=0.1, floor=0.0, history=64).rollout_probability(5) == pytest.approx(1e-5)
    assert greso(explore=1.0).rollout_probability(9) == 1.0
    assert policy.needs_history
