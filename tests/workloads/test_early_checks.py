"""Rewards' prefix verdicts (`early_check`, the `rollverify` rollout policy): a check that
says "decided" must be right for every continuation — the reward of the prefix as it
stands equals the reward of the prefix with anything appended. Property-tested on the
built-in checks, on text shaped like the workloads' answers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import workloads.longtail  # noqa: F401  (registers `sequence` and its check)
from workloads.datasets import TaskItem
from workloads.rewards import EpisodeView, SampleView, early_check, get_reward

PIECES = st.sampled_from([" ", "1", "2", "3", "4", "12", "-", "\n", "x", " 3", " 4", "."])
TEXT = st.lists(PIECES, max_size=10).map("".join)


def score(name: str, text: str, task: TaskItem) -> float:
    sample = SampleView("s", "n", text, ())
    return get_reward(name)(sample, EpisodeView({}), task)


@given(prefix=TEXT, rest=TEXT, answer=st.sampled_from(["1 2 3", "3 4", "12", "4", "-1"]))
def test_a_decided_prefix_scores_as_every_continuation(prefix: str, rest: str, answer: str) -> None:
    task = TaskItem("t", "q", answer)
    for name in ("sequence", "exact_answer"):
        decided = early_check(name)
        assert decided is not None
        if decided(prefix, task):
            assert score(name, prefix, task) == score(name, prefix + rest, task), name


def test_the_checks_stop_what_is_already_wrong_or_written() -> None:
    seq, first = early_check("sequence"), early_check("exact_answer")
    assert seq is not None and first is not None
    task = TaskItem("t", "list 7..9", "7 8 9")
    assert not seq(" 7 8", task)  # "8" may still become "89"
    assert seq(" 7 9 ", task)  # 9 where 8 belongs: wrong whatever follows
    assert not seq(" 7 8 9", task) and seq(" 7 8 9 10 ", task)  # one too many
    assert not seq(" 7 8 9 ", task)  # right so far: never decided
    assert first(" 12 and", TaskItem("t", "q", "12")) and not first(" 12", TaskItem("t", "q", "12"))
    assert early_check("verdict") is None  # a reward without a prefix verdict
