"""Rewards that run model-written code: `code_tests` (a coder) and `code_assertions` (a tester).

Both execute model output, so both run it in the sandbox (`workloads.sandbox`), never in
the worker, and both read only their own sample (they are scored as soon as it exists).

- `code_tests`: the fraction of the task's hidden tests that the sample's function passes.
  Inside the sandbox a harness loads the function and calls it on the tests' *inputs*
  only; the expected results never enter the sandbox, and each result comes back as a
  canonical literal (exact types: an `int` subclass whose `__eq__` always says yes is not
  an `int`) that is compared here, outside. So code cannot pass a test without computing
  its result: it can neither read the expectations nor fake the comparison.
- `code_assertions`: 1 when the sample's assertions (any code) run cleanly against the
  task's reference solution *and* fail against its wrong solution — valid tests that catch
  a bug — else 0. The two runs are separate executions (at once, on the sandbox pool), so
  the first cannot leave anything for the second.

Code that is merely wrong — a syntax error, a failing assertion, an exception, the wrong
result — scores 0. An execution the sandbox had to stop (the wall-clock timeout, the CPU,
memory, file-size, process or open-file limit, a forbidden action) is not a score: the
reward raises `SandboxError` with the reason, and the scoring framework marks the sample
failed with that reason and goes on. Built in: `workloads.rewards` imports this module.
"""

from __future__ import annotations

import json
import re
import secrets
import textwrap
from collections.abc import Collection, Mapping
from typing import Any

from workloads.code_tasks import CodeTask, parse_code_task
from workloads.datasets import TaskItem
from workloads.rewards import EpisodeView, SampleView, on_warm_up, register_reward
from workloads.sandbox import SandboxResult, default_pool, detect_isolation

# A result as a canonical literal (exact types); in the harness, and in-process for the
# generator's own (trusted) solutions (`workloads.code_repair.trusted_outputs`).
CANON = r"""
def canon(x, depth=0):
    t = type(x)
    if t is bool or t is int or t is float or t is str or x is None:
        return repr(x)
    if depth < 20 and (t is list or t is tuple):
        inner = ", ".join(canon(v, depth + 1) for v in x)
        return "[" + inner + "]" if t is list else "(" + inner + ("," if len(x) == 1 else "") + ")"
    raise TypeError("a result of type " + t.__name__)
"""

# Runs in the sandbox: loads solution.py, calls it on each call of .calls, prints one line
# `<nonce> {"loaded": bool, "outputs": [...]}`; an output is a canonical literal or
# "!ExceptionName". Limit exceptions are re-raised (sandbox_runtime.limit_of): they stop
# the execution and the reward raises, instead of counting as a failed test.
HARNESS = (
    r"""
import json, os, sandbox_runtime

with open(".calls") as f:
    calls = json.load(f)
with open(".nonce") as f:
    nonce = f.read()
os.remove(".calls")
os.remove(".nonce")

"""
    + CANON
    + r"""

def attempt(fn):
    try:
        return fn()
    except Exception as e:
        if sandbox_runtime.limit_of(e):
            raise
        return "!" + type(e).__name__


ns = {"__name__": "solution"}


def load():
    with open("solution.py") as f:
        exec(compile(f.read(), "solution.py", "exec"), ns)


loaded = attempt(load) is None
outputs = [attempt(lambda: canon(eval(c, ns)))[:1000] for c in calls] if loaded else []
line = nonce + " " + json.dumps({"loaded": loaded, "outputs": outputs})
os.write(1, ("\n" + line + "\n").encode())
"""
)

# Runs in the sandbox: the (trusted) solution, then the sample's tests in its namespace.
TEST_HARNESS = r"""
ns = {"__name__": "tests"}
with open("solution.py") as f:
    exec(compile(f.read(), "solution.py", "exec"), ns)
with open("tests.py") as f:
    source = f.read()
exec(compile(source, "tests.py", "exec"), ns)
"""

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|$)", re.S)


def extract_code(text: str) -> str:
    """The code of a completion: the first fenced block if it has one, else the whole
    text; dedented, and the first line's leading blanks dropped (a completion starts with
    the space that follows the prompt: `" assert f(2) == 5\nassert ..."`)."""
    m = _FENCE.search(text)
    return textwrap.dedent(m.group(1) if m else text).strip("\n").lstrip(" \t").rstrip() + "\n"


def _nothing(params: Mapping[str, Any]) -> Collection[str]:
    return ()


@on_warm_up("code_tests", "code_assertions")
def _warm_up() -> None:
    """Probe the sandbox when a reward process starts (a few process starts, once), not
    against the first call's timeout."""
    detect_isolation()


def _outputs(result: SandboxResult, nonce: str) -> list[str] | None:
    """The harness's outputs, or None when it printed no result line (the code ended the
    process itself, or broke its output)."""
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce + " "):
            try:
                doc = json.loads(line[len(nonce) + 1 :])
            except ValueError:
                return None
            outputs = doc.get("outputs") if isinstance(doc, dict) else None
            return outputs if isinstance(outputs, list) else None
    return None


def hidden_test_outputs(code: str, task: TaskItem, *, what: str) -> tuple[CodeTask, list[str]]:
    """`task`'s code task and what `code` gave on each of its hidden tests' calls (a
    canonical literal or `"!ExceptionName"`), run in the sandbox; `[]` when the code did not
    load (or printed no result). Raises `SandboxError` naming `what` when the sandbox had to
    stop it, `CodeTaskError` when `task` is not a code task."""
    ct = parse_code_task(task)
    nonce = secrets.token_hex(16)
    files = {
        "solution.py": code,
        ".calls": json.dumps([call for call, _ in ct.tests]),
        ".nonce": nonce,
    }
    result = default_pool().submit(HARNESS, files=files).result()
    result.raise_if_stopped(what)
    return ct, _outputs(result, nonce) or []


def passed_tests(outputs: list[str], tests: tuple[tuple[str, str], ...]) -> int:
    """How many of `tests` (call, expected) the outputs answer with the expected literal."""
    return sum(got == want for got, (_, want) in zip(outputs, tests, strict=False))


def hidden_test_score(code: str, task: TaskItem, *, what: str = "code_tests") -> float:
    """The fraction of `task`'s hidden tests `code` passes (raises `SandboxError` when the
    sandbox had to stop it, `CodeTaskError` when `task` is not a code task)."""
    ct, outputs = hidden_test_outputs(code, task, what=what)
    return passed_tests(outputs, ct.tests) / len(ct.tests)


@register_reward("code_tests", reads=_nothing)
def code_tests(sample: SampleView, episode: EpisodeView, task: TaskItem, **_: Any) -> float:
    """The fraction of the task's hidden tests the sample's function passes (sandboxed)."""
    return hidden_test_score(extract_code(sample.text), task, what=f"code_tests ({sample.id})")


@register_reward("code_assertions", reads=_nothing)
def code_assertions(sample: SampleView, episode: EpisodeView, task: TaskItem, **_: Any) -> float:
    """1 when the sample's tests pass on the reference solution and fail on the wrong one."""
    ct = parse_code_task(task)
    tests = extract_code(sample.text)
    pool = default_pool()
    runs = {
        which: pool.submit(TEST_HARNESS, files={"solution.py": code, "tests.py": tests})
        for which, code in (("reference", ct.solution), ("wrong solution", ct.wrong))
    }
    results = {which: run.result() for which, run in runs.items()}
    for which, result in results.items():
        result.raise_if_stopped(f"code_assertions ({sample.id}, against the {which})")
    return float(
        results["reference"].status == "ok" and results["wrong solution"].status == "error"
    )
