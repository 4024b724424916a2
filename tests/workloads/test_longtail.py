"""The long-tail workload: heavy-tailed answer lengths, the `sequence` rewards, its warm
start references, its MEG."""

from __future__ import annotations

import random

import numpy as np
import pytest

from flows.runs.config import load_config
from meg.spec import DatasetSpec
from workloads.datasets import DatasetError, TaskItem, load_dataset
from workloads.longtail import longtail, pareto_count, sequence_correct
from workloads.rewards import EpisodeView, SampleView, get_reward, reward_reads
from workloads.warm_start import PRESET_STEPS, reference_pairs


def test_tasks_are_seeded_right_and_heavy_tailed() -> None:
    pairs = longtail(random.Random(0), 2000)
    assert pairs == longtail(random.Random(0), 2000) != longtail(random.Random(1), 2000)
    counts = []
    for q, a in pairs:
        lo, hi = (int(x) for x in q.removeprefix("list ").split(".."))
        assert [int(x) for x in a.split()] == list(range(lo, hi + 1))
        counts.append(hi - lo + 1)
    c = np.array(counts)
    assert c.min() >= 2 and c.max() == 40  # the cap is reached
    assert np.percentile(c, 50) <= 4 and np.percentile(c, 99) >= 30  # a long tail
    assert np.mean(c >= 20) < 0.1  # ...of few tasks: P(count >= 20) ≈ (2/20)^1.2 = 0.063


def test_pareto_count_tail_follows_the_shape() -> None:
    rng = random.Random(3)
    c = np.array([pareto_count(rng, min_count=2, alpha=1.2, max_count=10**6) for _ in range(20000)])
    for x in (4, 8, 16):  # P(count >= x) ≈ (2/x)^1.2
        assert np.mean(c >= x) == pytest.approx((2 / x) ** 1.2, rel=0.15)


def test_generator_params_are_checked() -> None:
    for bad in ({"min_count": 0}, {"alpha": 0}, {"min_count": 5, "max_count": 4}):
        with pytest.raises(DatasetError, match="bad params for generator 'longtail'"):
            load_dataset(DatasetSpec(generator="longtail", params=bad))


TASK = TaskItem("t", "list 7..10", "7 8 9 10")


@pytest.mark.parametrize(
    ("text", "right"),
    [
        (" 7 8 9 10", True),
        ("7, 8, 9, 10.", True),
        (" 7 8 9", False),  # stopped early
        (" 7 8 9 10 11", False),
        (" 7 9 8 10", False),
        ("", False),
    ],
)
def test_sequence_reward(text: str, right: bool) -> None:
    assert sequence_correct(text, TASK) is right
    s = SampleView("e/count/0/0", "count", text, ())
    assert get_reward("sequence")(s, EpisodeView({s.id: s}), TASK) == float(right)


def test_sequence_verdict() -> None:
    def score(listed: str, said: str) -> float:
        c = SampleView("e/count/0/0", "count", listed, ())
        v = SampleView("e/check/0/0", "check", said, (c.id,))
        view = EpisodeView({c.id: c, v.id: v})
        return get_reward("sequence_verdict")(v, view, TASK, target="count")

    assert score(" 7 8 9 10", " yes") == score(" 7 8", " no") == 1.0
    assert score(" 7 8 9 10", " no") == score(" 7 8", " yes") == score(" 7 8", " hm") == 0.0
    assert reward_reads("sequence_verdict", {"target": "count"}) == frozenset({"count"})


def test_builtin_meg_and_its_warm_start_references() -> None:
    spec = load_config("longtail", check_models=False)
    assert spec.plugins == ["workloads.longtail"] and "longtail" in PRESET_STEPS
    assert spec.agents["counter"].sampling.max_tokens >= 80  # room for the tail
    tasks = load_dataset(spec.dataset).train[:200]
    rng = random.Random(0)
    verdicts = []
    for task in tasks:
        count, check = reference_pairs(spec, task, rng)
        assert count.completion == f" {task.answer}"
        shown = check.parents["count"]
        assert check.completion == (" yes" if sequence_correct(shown, task) else " no")
        if not sequence_correct(shown, task):  # a cut list: a prefix of the answer
            assert task.answer.startswith(shown.strip()) or len(task.answer.split()) == 1
        verdicts.append(check.completion)
    assert 0.3 < verdicts.count(" no") / len(verdicts) < 0.7
