"""The `code-repair` workload: the `run_tests` tool (real sandbox), the reviewer's
`repair_verdict` reward (with its per-round target), and warm-start reference episodes
over the unrolled loop (tool nodes give texts, not examples)."""

from __future__ import annotations

import json
import random

import pytest

from flows.runs.config import load_config
from workloads import BUILTIN
from workloads.code_repair import all_passed, reference_report, run_tests, trusted_outputs
from workloads.code_rewards import hidden_test_score
from workloads.datasets import TaskItem, load_dataset
from workloads.rewards import EpisodeView, SampleView, get_reward, reward_reads
from workloads.sandbox import SandboxError
from workloads.tools import TOOLS, ToolResult, get_tool, tool_reference
from workloads.warm_start import PRESET_STEPS, REFERENCES, reference_pairs

EMPTY = EpisodeView({})
TASK = TaskItem(
    "code-0",
    "f(x): x plus 3",
    json.dumps(
        {
            "solution": "def f(x): return x + 3",
            "wrong": "def f(x): return x + 4",
            "tests": [["f(0)", "3"], ["f(2)", "5"], ["f(-3)", "0"], ["f(10)", "13"], ["f(1)", "4"]],
        }
    ),
)


def _run(text: str, task: TaskItem = TASK) -> ToolResult:
    return ToolResult.of(run_tests(SampleView("c0", "code@1", text, ()), EMPTY, task))


def test_run_tests_is_a_built_in_tool_with_a_reference() -> None:
    assert get_tool("run_tests") is run_tests
    assert tool_reference("run_tests") is reference_report
    with pytest.raises(KeyError, match="tool 'calculator' has no reference observation"):
        tool_reference("calculator")
    assert get_reward("repair_verdict") is not None
    # what it reads is its target (a loop renames `test` to the round's `test@r`)
    assert reward_reads("repair_verdict", {"target": "test@2"}) == frozenset({"test@2"})
    assert "run_tests" in TOOLS


def test_right_code_passes_every_test_and_ends_the_loop() -> None:
    r = _run(" def f(x): return x + 3")
    assert r == ToolResult(" 5/5 passed", True, 1.0, {"passed": 5, "total": 5})
    assert _run("```python\ndef f(x):\n    return 3 + x\n```").text == " 5/5 passed"


def test_wrong_code_names_its_first_failing_call() -> None:
    r = _run(" def f(x): return x + 4")  # the wrong solution: every test
    assert r.text == " 0/5 passed; f(0) gave 4 not 3" and not r.terminal
    assert r.reward == 0.0 and r.metadata == {"passed": 0, "total": 5}
    r = _run(" def f(x): return abs(x) + 3")  # wrong on f(-3) only
    assert r.text == " 4/5 passed; f(-3) gave 6 not 0" and not r.terminal
    assert r.reward == 0.8 and r.metadata == {"passed": 4, "total": 5}
    assert r.reward == hidden_test_score(" def f(x): return abs(x) + 3"[1:], TASK)
    raised = _run(" def f(x): return y")
    assert raised.text == " 0/5 passed; f(0) gave !NameError not 3"
    assert _run(" def g(x): return x + 3").text == " 0/5 passed; f(0) gave !NameError not 3"
    long = _run(" def f(x): return list(range(100))")
    assert long.text.startswith(" 0/5 passed; f(0) gave [0, 1, 2") and long.text.endswith(
        "... not 3"
    )
    assert len(long.text) < 60


def test_code_that_does_not_load_has_no_function() -> None:
    for text in (" def f(x): return x +", " raise ValueError", " import nope"):
        r = _run(text)
        assert r.text == " 0/5 passed; no function" and not r.terminal
        assert r.reward == 0.0 and r.metadata == {"passed": 0, "total": 5}


def test_a_stopped_execution_raises_instead_of_reporting() -> None:
    with pytest.raises(SandboxError, match=r"run_tests \(c0\): .*(timeout|limit)"):
        _run("def f(x):\n    while True:\n        pass\n")
    assert _run(" def f(x): return x + 3").terminal  # the next call works


def _episode(verdict: str, report: str, r: int = 2) -> tuple[SampleView, EpisodeView]:
    """A reviewer sample of round r with its round's tool parent, and a tool sample of
    another round that says the opposite (resolving the wrong round would flip it)."""
    other = " 5/5 passed" if not all_passed(report) else " 0/5 passed; no function"
    samples = {
        "c": SampleView("c", f"code@{r}", " def f(x): return x", ()),
        "t": SampleView("t", f"test@{r}", report, ("c",)),
        "t1": SampleView("t1", f"test@{r - 1}", other, ()),
        "v": SampleView("v", f"review@{r}", verdict, ("t", "c", "t1")),
    }
    return samples["v"], EpisodeView(samples)


@pytest.mark.parametrize(
    ("verdict", "report", "score"),
    [
        (" yes", " 5/5 passed", 1.0),
        (" Yes.", " 5/5 passed", 1.0),
        (" no", " 5/5 passed", 0.0),
        (" yes", " 4/5 passed; f(-3) gave 6 not 0", 0.0),
        (" no", " 4/5 passed; f(-3) gave 6 not 0", 1.0),
        (" no", " 0/5 passed; no function", 1.0),
        (" 53f(", " 0/5 passed; no function", 0.0),  # neither word: no verdict
        (" yes no", " 5/5 passed", 0.0),  # both: no verdict
    ],
)
def test_the_reviewer_is_right_when_it_says_yes_exactly_when_all_passed(
    verdict: str, report: str, score: float
) -> None:
    fn = get_reward("repair_verdict")
    sample, episode = _episode(verdict, report)
    assert fn(sample, episode, TASK, target="test") == score  # resolved to test@2
    assert fn(sample, episode, TASK, target="test@2") == score  # a round named as is


def test_a_reviewer_without_its_target_parent_is_an_error() -> None:
    fn = get_reward("repair_verdict")
    _, episode = _episode(" yes", " 5/5 passed", r=3)
    lone = SampleView("v", "review@3", " yes", ("c",))
    with pytest.raises(ValueError, match=r"sample v \(review@3\) has no parent from node 'test@3'"):
        fn(lone, episode, TASK, target="test")


def test_the_reference_observation_matches_the_sandboxed_tool() -> None:
    """For the texts the warm start shows (the reference and the wrong solution), the
    in-process report equals the tool's sandboxed one."""
    tasks = load_dataset(load_config(str(BUILTIN["code-repair"]), check_models=False).dataset)
    for task in tasks.train[:6]:
        doc = json.loads(task.answer)
        for code in (doc["solution"], doc["wrong"], "def f(x): return x +"):
            assert reference_report(f" {code}", task) == _run(f" {code}", task).text
    assert trusted_outputs("def f(x): return 1 // x", ["f(0)", "f(1)"]) == [
        "!ZeroDivisionError",
        "1",
    ]
    assert trusted_outputs("def f(x) return", ["f(0)"]) == []


def test_warm_start_trains_agent_nodes_and_shows_tool_reports() -> None:
    spec = load_config(str(BUILTIN["code-repair"]), check_models=False)
    assert PRESET_STEPS["code-repair"] == 200 and "repair_verdict" in REFERENCES
    tools = {n for n, node in spec.nodes.items() if node.is_tool}
    assert tools == {"test@1", "test@2", "test@3"}
    tasks = load_dataset(spec.dataset).train[:40]
    rng = random.Random(0)
    verdicts = set()
    for task in tasks:
        doc = json.loads(task.answer)
        pairs = reference_pairs(spec, task, rng)
        assert len(pairs) == 6
        assert all("{" not in ex.prompt for ex in pairs)
        coders = [
            ex
            for ex in pairs
            if ex.template.startswith("Q: {question}\nA:") and not ex.template.endswith("OK?")
        ]
        reviewers = [ex for ex in pairs if ex.template.endswith("OK?")]
        assert len(coders) == 3 and len(reviewers) == 3
        assert sum("Fix:" in ex.template for ex in coders) == 2
        for ex in coders:  # every round is taught the reference solution
            assert ex.completion == f" {doc['solution']}"
        for ex in reviewers:
            (test,) = [v for k, v in ex.parents.items() if k.startswith("test@")]
            (code,) = [v for k, v in ex.parents.items() if k.startswith("code@")]
            assert code.strip() in (doc["solution"], doc["wrong"])
            if code.strip() == doc["solution"]:
                assert test == f" {len(doc['tests'])}/{len(doc['tests'])} passed"
            else:  # the wrong solution fails the first test, named in the report
                call, want = doc["tests"][0]
                assert test.startswith(" ") and f"; {call} gave " in test
                assert test.endswith(f" not {want}") and not all_passed(test)
            assert ex.completion == (" yes" if all_passed(test) else " no")
            verdicts.add(ex.completion)
    assert verdicts == {" yes", " no"}


@pytest.mark.parametrize(
    ("report", "score"),
    [
        (" 5/5 passed", 1.0),
        (" 2/5 passed; f(0) gave 4 not 3", 0.4),
        (" 0/5 passed; no function", 0.0),
    ],
)
def test_the_coder_is_rewarded_with_what_its_tests_reported(report: str, score: float) -> None:
    """`tests_passed` reads the code's own round's report (not another round's, not
    another sample's), so the code runs once, in the tool."""
    fn = get_reward("tests_passed")
    _, episode = _episode(" yes", report)
    code = episode.samples["c"]
    assert fn(code, episode, TASK, target="test") == score  # resolved to test@2
    assert reward_reads("tests_passed", {"target": "test@2"}) == frozenset({"test@2"})
    lone = SampleView("c9", "code@2", " def f(x): return x", ())
    with pytest.raises(ValueError, match=r"c9 \(code@2\) has no 'test@2' child"):
        fn(lone, episode, TASK, target="test")
