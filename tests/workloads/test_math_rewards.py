"""The math-verify rewards: equivalent answers accepted, expressions and runaway input
refused, GSM8K references, the verdict rule, and use from worker threads."""

from __future__ import annotations

import threading

import pytest

from workloads.datasets import TaskItem
from workloads.math_rewards import math_correct, math_parse, math_reference
from workloads.rewards import EpisodeView, SampleView, get_reward, reward_reads

TASK = TaskItem("t", "Ava has 3 pens. Ava buys 1 more pen. How many pens?", "3 + 1 = 4\n#### 4")
RIGHT = [
    "4",
    "4.0",
    " 4",
    "The answer is 4",
    "#### 4",
    " 3 + 1 = 4",
    " 4 pens",
    "4.",
    r"$4$",
    " 8/2",
]
WRONG = ["5", " 3 + 1 = 5", "The answer is 3", "", " yes", " four?", "#### 40", " 9^9^9", "2^2^2"]
# expressions are not final answers, though math-verify would call them equal to 4
WRONG += [" 3 + 1", " 5 - 1", " 2^2", " 2*2", " 4 - 0 + 0"]


@pytest.mark.parametrize("text", RIGHT)
def test_math_answer_accepts_equivalent_answers(text: str) -> None:
    s = SampleView("e/solve/0/0", "solve", text, ())
    assert get_reward("math_answer")(s, EpisodeView({s.id: s}), TASK) == 1.0


@pytest.mark.parametrize("text", WRONG)
def test_math_answer_rejects_other_answers(text: str) -> None:
    s = SampleView("e/solve/0/0", "solve", text, ())
    assert get_reward("math_answer")(s, EpisodeView({s.id: s}), TASK) == 0.0


def test_references_and_gsm8k_answers() -> None:
    assert math_reference("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert math_reference("1,200") == "1200" and math_reference(" 7 ") == "7"
    gsm = TaskItem("g", "q", "She makes 9 * 2 = $<<9*2=18>>18 a day.\n#### 1,018")
    assert math_correct("1018", gsm) and math_correct("So she makes $1,018.", gsm)
    assert not math_correct("18", gsm)
    assert math_correct(" 1/2", TaskItem("h", "q", "#### 0.5"))


def test_runaway_expressions_are_refused_fast() -> None:
    """No timeout can stop sympy inside C code: such expressions never reach `verify`."""
    for text in (" 10^10^10", " 9999999999^9999999", " ((9^64)^64)^64", r" \binom{100000}{5000}"):
        assert math_parse(text) == () and not math_correct(text, TASK)
    assert math_parse(" 2^2") != () and math_correct(r" \boxed{4}", TASK)


def _verify_episode(answer: str, said: str) -> tuple[SampleView, EpisodeView]:
    solve = SampleView("e/solve/0/0", "solve", answer, ())
    verify = SampleView("e/verify/0/0", "verify", said, (solve.id,))
    return verify, EpisodeView({solve.id: solve, verify.id: verify})


@pytest.mark.parametrize(
    ("answer", "said", "expected"),
    [
        (" 3 + 1 = 4", " yes", 1.0),
        (" 4.0", " Yes.", 1.0),
        (" 3 + 1 = 4", " no", 0.0),
        (" 3 + 1 = 5", " no", 1.0),
        (" 3 + 1 = 5", " yes", 0.0),
        (" 3 + 1 = 4", " maybe", 0.0),
        (" 3 + 1 = 4", "", 0.0),
    ],
)
def test_math_verdict(answer: str, said: str, expected: float) -> None:
    sample, episode = _verify_episode(answer, said)
    assert get_reward("math_verdict")(sample, episode, TASK, target="solve") == expected


def test_math_verdict_needs_its_target_and_declares_reads() -> None:
    sample, episode = _verify_episode(" 4", " yes")
    with pytest.raises(ValueError, match="no parent from node 'other'"):
        get_reward("math_verdict")(sample, episode, TASK, target="other")
    assert reward_reads("math_verdict", {"target": "solve"}) == frozenset({"solve"})
    assert reward_reads("math_answer", {}) == frozenset()


def test_rewards_work_outside_the_main_thread() -> None:
    """Dask runs rewards in worker threads; math-verify's signal timeouts would raise there."""
    results: list[list[float]] = [[], [], []]  # one list per thread: no interleaving
    errors: list[BaseException] = []
    texts = [*RIGHT, *WRONG, " 7 + 8 = 15", " 1,000,001"]  # some not parsed before (no cache)

    def run(mine: list[float]) -> None:
        try:
            for k, text in enumerate(texts):
                s = SampleView(f"e/solve/0/{k}", "solve", text, ())
                mine.append(get_reward("math_answer")(s, EpisodeView({s.id: s}), TASK))
            sample, episode = _verify_episode(" 3 + 1 = 5", " no")
            mine.append(get_reward("math_verdict")(sample, episode, TASK, target="solve"))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(mine,)) for mine in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    one = [*[1.0] * len(RIGHT), *[0.0] * len(WRONG), 0.0, 0.0, 1.0]
    assert results == [one] * 3
