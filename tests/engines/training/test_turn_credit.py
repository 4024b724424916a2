"""Per-turn credit rules: reductions to GRPO, the lucky-repair case, NaN rows, validation."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.training.advantages import compute_advantages
from engines.training.turn_credit import (
    CREDITS,
    TurnRows,
    bellman_closure,
    threads,
    turn_credit,
)
from meg.registry import UnknownNameError

RULES = ["turn", "episode", "crbc"]
ESTIMATORS = ["grpo", "grpo_no_std", "rloo", "maxrl"]
Row = tuple[str, int, int, float, str]  # group, parent, round, reward, state


def make(rows: list[Row]) -> TurnRows:
    g, p, r, w, s = (np.asarray(c) for c in zip(*rows, strict=True)) if rows else [np.array([])] * 5
    return TurnRows(group=g, parent=p, round=r, reward=w, state=s)


def grpo_ref(rewards: list[float], groups: list[int], estimator: str = "grpo") -> np.ndarray:
    adv = compute_advantages(
        estimator, torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups)
    )
    return adv.numpy()


ONE_ROUND: list[Row] = [
    ("a", -1, 1, 1.0, "start"),
    ("a", -1, 1, 0.0, "start"),
    ("a", -1, 1, 0.25, "start"),
    ("b", -1, 1, 0.5, "start"),
    ("b", -1, 1, 0.0, "start"),
    ("c", -1, 1, 0.75, "start"),  # a singleton group: no baseline, advantage 0
]


# Lucky repair: threads 0 and 1 both fail round 1 into the same state; 1's repair succeeds
# by luck, 2's fails. Thread 4 passes at once. Row indices: 0, 1, 4 are round 1.
LUCKY: list[Row] = [
    ("p", -1, 1, 0.0, "r1 | task"),
    ("p", -1, 1, 0.0, "r1 | task"),
    ("p", 0, 2, 1.0, "r2 | passed 3/5"),
    ("p", 1, 2, 0.0, "r2 | passed 3/5"),
    ("p", -1, 1, 1.0, "r1 | task"),
]


def test_final_and_threads() -> None:
    rows = make(LUCKY)
    assert rows.final.tolist() == [False, False, True, True, True]
    assert threads(rows).tolist() == [0, 1, 0, 1, 4]
    assert len(rows) == 5


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_one_round_episode_equals_turn_equals_estimator(estimator: str) -> None:
    rows = make(ONE_ROUND)
    want = grpo_ref([r[3] for r in ONE_ROUND], [0, 0, 0, 1, 1, 2], estimator)
    for rule in ("turn", "episode"):
        np.testing.assert_allclose(turn_credit(rule, rows, estimator), want, atol=1e-6)


def test_one_round_shared_start_crbc_is_grpo_centring() -> None:
    rows = make(ONE_ROUND)
    rewards, groups = [r[3] for r in ONE_ROUND], [0, 0, 0, 1, 1, 2]
    np.testing.assert_allclose(
        turn_credit("crbc", rows, "grpo"), grpo_ref(rewards, groups), atol=1e-6
    )
    np.testing.assert_allclose(
        turn_credit("crbc", rows, "grpo_no_std"),
        grpo_ref(rewards, groups, "grpo_no_std"),
        atol=1e-6,
    )


def test_chains_with_distinct_later_states_crbc_credits_roots_like_episode() -> None:
    # Each thread is a chain; past round 1 no two rows share a state, so a later turn's
    # baseline is its round's mean Q (a lone state's own V would make every such turn 0),
    # while each root's Q is its chain's final reward.
    rows = make(
        [
            ("a", -1, 1, 0.0, "s"),
            ("a", 0, 2, 0.0, "x"),
            ("a", 1, 3, 1.0, "y"),
            ("a", -1, 1, 0.0, "s"),
            ("a", 3, 2, 0.0, "z"),
            ("a", -1, 1, 0.5, "s"),
        ]
    )
    ep, cr = turn_credit("episode", rows, "grpo"), turn_credit("crbc", rows, "grpo")
    roots = [0, 3, 5]
    np.testing.assert_allclose(cr[roots], ep[roots], atol=1e-6)
    unscaled = turn_credit("crbc", rows, "grpo_no_std")
    # round 2: Q = 1 (its child's state) and 0 (final), mean 0.5; round 3: one row, A = 0
    np.testing.assert_allclose(unscaled[[1, 4, 2]], [0.5, -0.5, 0.0], atol=1e-6)


def test_lucky_repair_crbc_credits_first_turns_equally_episode_does_not() -> None:
    rows = make(LUCKY)
    q, v = bellman_closure(rows)
    np.testing.assert_allclose(q, [0.5, 0.5, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(v, [2 / 3, 2 / 3, 0.5, 0.5, 2 / 3])

    cr = turn_credit("crbc", rows, "grpo_no_std")
    np.testing.assert_allclose(cr, [-1 / 6, -1 / 6, 0.5, -0.5, 1 / 3], atol=1e-6)
    scaled = turn_credit("crbc", rows, "grpo")  # / std of path returns [1, 0, 1]
    np.testing.assert_allclose(scaled, cr / (np.std([1, 0, 1], ddof=1) + 1e-6), atol=1e-5)

    ep = turn_credit("episode", rows, "grpo")
    assert ep[0] > 0 > ep[1]  # the lucky thread is credited for its first turn too
    np.testing.assert_allclose(ep[[0, 1, 4]], grpo_ref([1.0, 0.0, 1.0], [0, 0, 0]), atol=1e-6)
    assert ep[2] == ep[0] and ep[3] == ep[1]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("rule", RULES)
def test_equal_rewards_give_zero(rule: str, estimator: str) -> None:
    rows = make([(g, p, r, 0.3, s) for g, p, r, _, s in LUCKY + ONE_ROUND])
    np.testing.assert_allclose(turn_credit(rule, rows, estimator), 0.0, atol=1e-6)


def test_nan_rows_are_excluded() -> None:
    rows = make(
        [
            ("a", -1, 1, 0.0, "s"),  # 0: its only child failed → excluded
            ("a", 0, 2, math.nan, "t"),
            ("a", -1, 1, 1.0, "s"),  # 2
            ("a", -1, 1, 0.0, "s"),  # 3
            ("a", -1, 1, math.nan, "s"),  # 4: failed first turn
        ]
    )
    for rule in RULES:
        adv = turn_credit(rule, rows, "grpo")
        assert np.isfinite(adv).all()
        assert adv[1] == 0.0 and adv[4] == 0.0, rule
    for rule in ("episode", "crbc"):
        adv = turn_credit(rule, rows, "grpo")
        assert adv[0] == 0.0  # no finite return below it
        np.testing.assert_allclose(adv[[2, 3]], grpo_ref([1.0, 0.0], [0, 0]), atol=1e-6)
    np.testing.assert_allclose(
        turn_credit("turn", rows, "grpo")[[0, 2, 3]], grpo_ref([0.0, 1.0, 0.0], [0] * 3)
    )


@pytest.mark.parametrize("rule", RULES)
def test_empty_rows(rule: str) -> None:
    assert turn_credit(rule, make([]), "grpo").shape == (0,)


@st.composite
def turn_trees(draw: st.DrawFn) -> TurnRows:
    """Random forests (≤3 groups, ≤4 threads, ≤3 rounds, ≤2 children), rows shuffled."""
    rows: list[Row] = []
    rewards = st.one_of(st.sampled_from([0.0, 0.5, 1.0, math.nan]), st.floats(-2.0, 2.0))

    def grow(group: str, parent: int, rnd: int) -> None:
        i = len(rows)
        state = f"round {rnd} | {draw(st.integers(0, 2))}"
        rows.append((group, parent, rnd, draw(rewards), state))
        if rnd < 3:
            for _ in range(draw(st.integers(0, 2))):
                grow(group, i, rnd + 1)

    for g in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 4))):
            grow(f"g{g}", -1, 1)
    order = draw(st.permutations(range(len(rows))))  # new position k holds old row order[k]
    where = {old: new for new, old in enumerate(order)}
    return make(
        [(g, where[p] if p >= 0 else -1, r, w, s) for g, p, r, w, s in (rows[o] for o in order)]
    )


@settings(max_examples=150, deadline=None)
@given(turn_trees())
def test_crbc_properties_on_random_trees(rows: TurnRows) -> None:
    for estimator in ESTIMATORS:
        for rule in RULES:
            adv = turn_credit(rule, rows, estimator)
            assert adv.dtype == np.float32 and adv.shape == (len(rows),)
            assert np.isfinite(adv).all()
            assert (adv[~np.isfinite(rows.reward)] == 0).all()
    adv = turn_credit("crbc", rows, "grpo_no_std")  # unscaled: A = Q − V
    q, _ = bellman_closure(rows)
    merged: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for g, r, s, a, qi in zip(rows.group, rows.round, rows.state, adv, q, strict=True):
        if np.isfinite(qi):
            merged[(str(g), int(r), str(s))].append(float(a))
    shared = [sum(a) for a in merged.values() if len(a) > 1]  # lone states: the round's mean
    assert all(abs(total) < 1e-4 for total in shared), merged


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([("a", -1, 1, 0.0, "s"), ("a", 5, 2, 0.0, "t")], r"parent index 5 out of range"),
        ([("a", -1, 1, 0.0, "s"), ("a", -3, 2, 0.0, "t")], r"out of range"),
        ([("a", -1, 1, 0.0, "s"), ("a", 0, 3, 0.0, "t")], r"round 3 but parent 0 has round 1"),
        ([("a", -1, 1, 0.0, "s"), ("a", 1, 2, 0.0, "t")], r"round 2 but parent 1 has round 2"),
        ([("a", -1, 0, 0.0, "s")], r"round 0 < 1"),
        ([("a", -1, 1, 0.0, "s"), ("b", 0, 2, 0.0, "t")], r"parent 0 is in group 'a', not 'b'"),
    ],
)
def test_bad_tree_raises(rows: list[Row], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(rows)


def test_a_later_turn_without_its_earlier_ones_is_a_root() -> None:
    """`turn` credit reads one round at a time: its rows are roots of their own."""
    rows = make([("a", -1, 2, 1.0, "s"), ("a", -1, 2, 0.0, "t")])
    assert turn_credit("turn", rows, "grpo_no_std").tolist() == [0.5, -0.5]


def test_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="equal length"):
        TurnRows(*(np.asarray(c) for c in (["a", "a"], [-1], [1], [0.0], ["s"])))
    with pytest.raises(ValueError, match="1-D"):
        TurnRows(*(np.asarray([c]) for c in (["a"], [-1], [1], [0.0], ["s"])))


def test_rows_are_frozen_numpy() -> None:
    rows = make(LUCKY)
    assert rows.parent.dtype == np.int64 and rows.reward.dtype == np.float32
    with pytest.raises(AttributeError):
        rows.reward = np.zeros(5)  # type: ignore[misc]


def test_unknown_names_list_the_known_ones() -> None:
    assert CREDITS.names() == ["crbc", "episode", "turn"]
    with pytest.raises(UnknownNameError, match=r"unknown turn credit rule 'td'.*crbc, episode"):
        turn_credit("td", make(LUCKY), "grpo")
    with pytest.raises(UnknownNameError, match="unknown advantage estimator 'gpro'"):
        turn_credit("crbc", make(LUCKY), "gpro")
