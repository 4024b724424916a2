"""Small Python function tasks: a seeded generator, the task format, warm-start references.

A task asks for a one-line function (`"f(x): x plus 3"` → `def f(x): return x + 3`) and
carries, in its answer, everything the rewards need to judge code by running it: the
reference solution, a *wrong* solution (nearly right: an operand off by one, a neighbouring
operation) and hidden tests — calls with their expected results, written as Python literals::

    {"solution": "def f(x): return x + 3",
     "wrong": "def f(x): return x + 4",
     "tests": [["f(0)", "3"], ["f(7)", "10"], ...]}

The first hidden test always tells the wrong solution from the right one, on the simplest
input that does (`SIMPLE_INPUTS`); the warm start teaches the tester that assertion.
Expected results are computed here, by evaluating the generator's own templates: no model
output is ever run outside the sandbox.

The generator `code_tasks` (params `families`, `max_k`, `tests`) is registered on import;
`workloads.rewards` imports it with the code rewards (`code_tests`, `code_assertions` in
`workloads.code_rewards`), so it is built in, and `workloads/code.yaml` lists it as a
plug-in as well, like the other generated workloads. Data of your own in this format works
too: a JSONL file whose answer field holds the JSON above as a string.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workloads.datasets import TaskItem, register_generator


class CodeTaskError(ValueError):
    """A task whose answer is not a code task (the message names the task and the format)."""


@dataclass(frozen=True, slots=True)
class Family:
    """One kind of task: `f(arg)` returns `body` (`{k}` the task's constant); `wrong` are
    bodies of nearly-right functions (`{k1}` is k + 1)."""

    name: str
    arg: str  # "x": an integer; "xs": a list of integers
    question: str
    body: str
    wrong: tuple[str, ...]
    k_min: int = 1


FAMILIES = {
    f.name: f
    for f in (
        Family("add", "x", "x plus {k}", "x + {k}", ("x + {k1}", "x - {k}")),
        Family("sub", "x", "x minus {k}", "x - {k}", ("x - {k1}", "x + {k}")),
        Family("mul", "x", "x times {k}", "x * {k}", ("x * {k1}", "x + {k}")),
        Family("max", "x", "the larger of x and {k}", "max(x, {k})", ("min(x, {k})",)),
        Family("min", "x", "the smaller of x and {k}", "min(x, {k})", ("max(x, {k})",)),
        Family("mod", "x", "x mod {k}", "x % {k}", ("x % {k1}", "x // {k}"), k_min=2),
        Family("div", "x", "x divided by {k}, rounded down", "x // {k}", ("x % {k}",), k_min=2),
        Family("square", "x", "x squared plus {k}", "x * x + {k}", ("x * x + {k1}", "x * {k}")),
        Family("dist", "x", "the distance from x to {k}", "abs(x - {k})", ("x - {k}",)),
        Family(
            "multiple",
            "x",
            "whether x is a multiple of {k}",
            "x % {k} == 0",
            ("x % {k} != 0", "x % {k1} == 0"),
            k_min=2,
        ),
        Family("sum", "xs", "the sum of xs plus {k}", "sum(xs) + {k}", ("len(xs) + {k}",)),
        Family(
            "count",
            "xs",
            "how many items of xs are greater than {k}",
            "len([v for v in xs if v > {k}])",
            ("len([v for v in xs if v >= {k}])", "len([v for v in xs if v < {k}])"),
        ),
        Family(
            "shift",
            "xs",
            "xs with {k} added to each item",
            "[v + {k} for v in xs]",
            ("[v + {k1} for v in xs]", "[v * {k} for v in xs]"),
        ),
    )
}
# A tiny model learns these from a warm start: one operator and one constant each.
DEFAULT_FAMILIES = ("add", "sub", "mul", "max", "min")


@dataclass(frozen=True, slots=True)
class CodeTask:
    """A task's answer, parsed: reference and wrong solutions, hidden tests (call, expected)."""

    solution: str
    wrong: str
    tests: tuple[tuple[str, str], ...]


# The first hidden test's input, when one of these catches the wrong solution: its result
# is then a copy of the constant (`f(0) == 3` for "x plus 3", `f(1) == 4` for "x times 4"),
# an assertion a tiny tester can learn to write without doing arithmetic.
SIMPLE_INPUTS: dict[str, tuple[Any, ...]] = {"x": (0, 1, -1, 2)}


def _inputs(rng: random.Random, arg: str) -> list[Any]:
    """A pool of distinct inputs: 30 integers of -9..20 (the simple ones first), or short
    integer lists."""
    if arg == "x":
        simple = SIMPLE_INPUTS["x"]
        return [*simple, *rng.sample([v for v in range(-9, 21) if v not in simple], 26)]
    lists = {tuple(rng.randint(-5, 15) for _ in range(rng.randint(0, 5))) for _ in range(40)}
    return [list(t) for t in sorted(lists)]


def _fn(arg: str, body: str) -> Callable[[Any], Any]:
    # our own templates with an integer filled in: trusted code, evaluated here
    fn: Callable[[Any], Any] = eval(f"lambda {arg}: {body}")
    return fn


def code_task(rng: random.Random, family: Family, *, max_k: int, tests: int) -> tuple[str, str]:
    """One `(question, answer)` of `family` (see module doc)."""
    k = rng.randint(family.k_min, max(family.k_min, max_k))
    fill = {"k": k, "k1": k + 1}
    body = family.body.format(**fill)
    right = _fn(family.arg, body)
    pool = _inputs(rng, family.arg)
    for wrong_body in rng.sample(family.wrong, len(family.wrong)):
        wrong = _fn(family.arg, wrong_body.format(**fill))
        catching = [v for v in pool if wrong(v) != right(v) or type(wrong(v)) is not type(right(v))]
        if catching:
            break
    else:  # cannot happen with these families and input pools; never emit an uncatchable task
        raise RuntimeError(f"code task {family.name!r}, k={k}: no wrong solution differs")
    simple = [v for v in SIMPLE_INPUTS.get(family.arg, ()) if v in catching]
    first = simple[0] if simple else rng.choice(catching)
    rest = rng.sample([v for v in pool if v != first], min(tests, len(pool)) - 1)
    answer = {
        "solution": f"def f({family.arg}): return {body}",
        "wrong": f"def f({family.arg}): return {wrong_body.format(**fill)}",
        "tests": [[f"f({v!r})", repr(right(v))] for v in [first, *rest]],
    }
    return f"f({family.arg}): {family.question.format(**fill)}", json.dumps(answer)


@register_generator("code_tasks")
def code_tasks(
    rng: random.Random,
    size: int,
    *,
    families: Sequence[str] | None = None,
    max_k: int = 9,
    tests: int = 5,
) -> list[tuple[str, str]]:
    """`size` seeded function tasks from `families` (names of `FAMILIES`; default
    `DEFAULT_FAMILIES`), constants up to `max_k`, `tests` hidden tests each."""
    names = list(DEFAULT_FAMILIES if families is None else families)
    unknown = sorted(set(names) - set(FAMILIES))
    if not names or unknown or isinstance(families, str):
        raise TypeError(
            f"families must be a non-empty list of {', '.join(FAMILIES)} (got {families!r})"
        )
    if max_k < 2 or not 1 <= tests <= 20:
        raise TypeError(f"need max_k >= 2 and 1 <= tests <= 20 (got {max_k}, {tests})")
    chosen = [FAMILIES[n] for n in names]
    return [code_task(rng, rng.choice(chosen), max_k=max_k, tests=tests) for _ in range(size)]


def parse_code_task(task: TaskItem) -> CodeTask:
    """The code task in `task.answer`; `CodeTaskError` naming the task when it is not one."""
    fix = (
        'a code task\'s answer is JSON {"solution": ..., "wrong": ..., "tests": '
        "[[call, expected], ...]} (workloads/code_tasks.py)"
    )
    try:
        doc = json.loads(task.answer)
    except ValueError as e:
        raise CodeTaskError(f"task {task.id}: answer is not JSON ({e}); {fix}") from None
    ok = isinstance(doc, dict) and all(isinstance(doc.get(k), str) for k in ("solution", "wrong"))
    tests = doc.get("tests") if isinstance(doc, dict) else None
    pairs = isinstance(tests, list) and all(
        isinstance(t, list) and len(t) == 2 and all(isinstance(s, str) for s in t) for t in tests
    )
    if not ok or not pairs or not tests:
        raise CodeTaskError(f"task {task.id}: answer is not a code task; {fix}")
    return CodeTask(doc["solution"], doc["wrong"], tuple((c, e) for c, e in tests))


# --- warm start: the completions the code rewards score as right ----------------------------


def reference_code(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    """The coder's reference completion: the reference solution on one line."""
    return f" {parse_code_task(task).solution}"


def shown_code(completion: str, task: TaskItem, rng: random.Random) -> str:
    """What the tester is shown of the coder: half the right functions replaced by the
    task's wrong one, so the tester meets both and learns that its test is what counts."""
    ct = parse_code_task(task)
    if completion.strip() == ct.solution and rng.random() < 0.5:
        return f" {ct.wrong}"
    return completion


def reference_assertions(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    """The tester's reference completion: the first hidden test as an assertion (it holds
    for the reference solution and fails for the wrong one)."""
    call, expected = parse_code_task(task).tests[0]
    return f" assert {call} == {expected}"
