"""The `code-repair` workload's tool and reviewer reward: `run_tests` and `repair_verdict`.

- tool `run_tests`: runs the sample's function on the task's hidden tests in the sandbox,
  exactly as the `code_tests` reward does (`workloads.code_rewards.hidden_test_outputs`),
  and answers with a short report for the next prompt (a tiny model reads it)::

      " 5/5 passed"                        every test passed (terminal; reward 1)
      " 2/5 passed; f(0) gave 4 not 3"     the first failing test: call, result, expected
      " 0/5 passed; f(0) gave !NameError not 3"   the call raised
      " 0/5 passed; no function"           the code did not load (a syntax error, ...)

  Its reward is the fraction passed, its metadata `{"passed": p, "total": t}`. An execution
  the sandbox had to stop (timeout, a limit, a forbidden action) raises `SandboxError`: the
  call fails, as a reward's does, instead of returning text.
- reward `repair_verdict` (param `target`, the tool node the reviewer reads): 1 when the
  reviewer says yes (its text contains `yes`, case-insensitive: the loop's `until`
  condition) where its `target` parent's report says every test passed, or no where it
  does not; a text with both words or neither is no verdict and scores 0. A reward bound
  to a loop body node has its params naming body nodes renamed per round when the loop
  unrolls (`target: test` is `test@2` for `review@2`), so it reads (and waits for) its
  round's report only; a `target` without a round read from a round node is resolved the
  same way here.

Warm start: `run_tests` carries a reference observation (`reference_report`: the report
for the task's reference or wrong solution, computed in-process from the generator's own
trusted source, never from model output) and `reference_verdict` is `repair_verdict`'s
reference completion (`workloads.warm_start.REFERENCES`). Built in: `workloads.tools` and
`workloads.rewards` name this module.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from meg.conditions import contains
from workloads.code_rewards import CANON, extract_code, hidden_test_outputs, passed_tests
from workloads.code_tasks import parse_code_task
from workloads.datasets import TaskItem
from workloads.rewards import EpisodeView, SampleView, register_reward
from workloads.tools import ToolResult, register_tool

MAX_GAVE = 24  # characters of a failing call's result shown in the report

_REPORT = re.compile(r"\s*(\d+)/(\d+) passed")


def report(outputs: list[str], tests: tuple[tuple[str, str], ...]) -> ToolResult:
    """The `run_tests` result for `outputs` (one per test, or `[]`: did not load)."""
    total = len(tests)
    passed = passed_tests(outputs, tests)
    meta = {"passed": passed, "total": total}
    head = f" {passed}/{total} passed"
    if passed == total:
        return ToolResult(head, terminal=True, reward=1.0, metadata=meta)
    if not outputs:
        return ToolResult(f"{head}; no function", reward=0.0, metadata=meta)
    padded = [*outputs[:total], *["nothing"] * (total - len(outputs))]
    call, want, got = next((c, w, g) for g, (c, w) in zip(padded, tests, strict=True) if g != w)
    if len(got) > MAX_GAVE:
        got = got[: MAX_GAVE - 3] + "..."
    return ToolResult(f"{head}; {call} gave {got} not {want}", reward=passed / total, metadata=meta)


def all_passed(text: str) -> bool:
    """Whether a `run_tests` report says every test passed (`" 5/5 passed"`)."""
    m = _REPORT.match(text)
    return m is not None and m.group(1) == m.group(2)


def is_report(text: str) -> bool:
    return _REPORT.match(text) is not None


def trusted_outputs(source: str, calls: list[str]) -> list[str]:
    """What `hidden_test_outputs` would give for *trusted* code — a generator's own
    solution, never model output — computed in this process with the harness's `canon`:
    a canonical literal per call, `"!ExceptionName"` when it raised, `[]` when the source
    does not load."""
    ns: dict[str, Any] = {"__name__": "solution"}
    exec(CANON, ns)  # our own source: defines canon
    try:
        exec(compile(source, "solution.py", "exec"), ns)
    except Exception:
        return []
    out = []
    for call in calls:
        try:
            out.append(str(ns["canon"](eval(call, ns)))[:1000])
        except Exception as e:
            out.append("!" + type(e).__name__)
    return out


def reference_report(text: str, task: TaskItem, **_: Any) -> str:
    """`run_tests`'s text for a warm-start completion, without the sandbox: the report for
    the task's reference solution or its wrong one (run in-process: the generator's text),
    and `no function` for anything else (the warm start shows the coder nothing else)."""
    ct = parse_code_task(task)
    code = extract_code(text).strip()
    if code == ct.solution.strip():
        return report([want for _, want in ct.tests], ct.tests).text
    if code == ct.wrong.strip():
        return report(trusted_outputs(ct.wrong, [c for c, _ in ct.tests]), ct.tests).text
    return report([], ct.tests).text


@register_tool("run_tests", reference=reference_report)
def run_tests(sample: SampleView, episode: EpisodeView, task: TaskItem, **_: Any) -> ToolResult:
    """The sample's function on the task's hidden tests (sandboxed): a short report (module
    doc), terminal when every test passed."""
    ct, outputs = hidden_test_outputs(
        extract_code(sample.text), task, what=f"run_tests ({sample.id})"
    )
    return report(outputs, ct.tests)


def round_target(target: str, node: str) -> str:
    """`target` in the round of `node`: a body name (`test`) read from `review@2` is
    `test@2`; a name with a round, or read from a node outside a loop, is as written."""
    _, at, r = node.rpartition("@")
    return f"{target}@{r}" if at and "@" not in target else target


def _reads_target(params: Mapping[str, Any]) -> tuple[str, ...]:
    return (str(params["target"]),)


@register_reward("repair_verdict", reads=_reads_target)
def repair_verdict(
    sample: SampleView,
    episode: EpisodeView,
    task: TaskItem,
    *,
    target: str,
    yes: str = "yes",
    no: str = "no",
) -> float:
    """1 when the sample says `yes` where its `target` parent (in its round) reports every
    test passed, or `no` where it does not; 0 otherwise, including a text that says both
    or neither (module doc)."""
    node = round_target(target, sample.node)
    judged = [
        episode.samples[p]
        for p in sample.parent_ids
        if p in episode.samples and episode.samples[p].node == node
    ]
    if not judged:
        raise ValueError(
            f"repair_verdict reward: sample {sample.id} ({sample.node}) has no parent from "
            f"node {node!r}"
        )
    said_yes = contains(sample.text, False, text=yes)
    if said_yes == contains(sample.text, False, text=no):
        return 0.0  # both or neither: no verdict
    return float(said_yes == all_passed(judged[0].text))


@register_reward("tests_passed", reads=_reads_target)
def tests_passed(sample: SampleView, episode: EpisodeView, task: TaskItem, *, target: str) -> float:
    """The fraction of hidden tests the sample's code passed, read from its `target` child's
    `run_tests` report (`" 3/5 passed..."` → 0.6): the tool already ran the code in the
    sandbox, so the coder's reward does not run it a second time (`code_tests` would).
    The report is the tool's text, never the model's."""
    node = round_target(target, sample.node)
    reports = [
        s.text for s in episode.samples.values() if s.node == node and sample.id in s.parent_ids
    ]
    if not reports:
        raise ValueError(
            f"tests_passed reward: sample {sample.id} ({sample.node}) has no {node!r} child"
        )
    m = _REPORT.match(reports[0])
    if m is None:
        raise ValueError(f"tests_passed reward: {reports[0]!r} is not a run_tests report")
    return int(m.group(1)) / int(m.group(2))


def reference_verdict(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    """`repair_verdict`'s warm-start completion: ` yes` when the report among the parents
    says every test passed, else ` no`."""
    reports = [t for t in parents.values() if is_report(t)]
    return " yes" if reports and all_passed(reports[0]) else " no"
