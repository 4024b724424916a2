"""Rewards that check answers with math-verify: `math_answer`, `math_verdict`.

The reference is the number after the last `####` of the task's answer (GSM8K's format; the
whole answer when it has none); a response's final answer is what math-verify parses from
it (its last expression: "5 + 3 = 8" -> 8, "The answer is 8." -> 8, "8.0" -> 8), and it
must be a number (`_is_number`: "5 + 3" alone is an expression, not an answer).

math-verify's default timeouts use SIGALRM, which raises outside the main thread, and these
functions are also called in threads (tests, your own tools); a reward call in training is
bounded by its reward process's timeout (`tasks.reward_calls`) anyway. So they are off
(`parsing_timeout=None`, `timeout_seconds=None`) and the inputs are bounded instead — the
last `MATH_MAX_CHARS` characters of a text, and an expression whose evaluation could run
away (`9^9^9`: the alarm could not stop it either, it spins in C) is refused before
`verify` and scored as wrong. Built in: `workloads.rewards` imports this module.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from workloads.datasets import TaskItem
from workloads.rewards import answer_reward, on_warm_up, verdict_reward

MATH_MAX_CHARS = 256
_MATH_LOCK = threading.Lock()  # sympy and the latex parser: one parse at a time per process
_MAX_EXPONENT = 64


class _QuietTimeoutWarning(logging.Filter):
    """Drop math-verify's one-off "Timeout is disabled" warning: disabling it is deliberate."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_QuietTimeoutWarning())


def math_reference(answer: str) -> str:
    """The reference of a GSM8K-format answer: the text after its last `####` (the whole
    answer when there is none), stripped, thousands separators removed."""
    _, sep, tail = answer.rpartition("####")
    return (tail if sep else answer).strip().replace(",", "")


def _tame(expr: Any) -> bool:
    """False for a parsed expression whose comparison could run away: a power whose
    exponent is not a small number (`9^9^9`, `10^100000`), a power of a power, a
    combinatorial function (`100000!`)."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return True  # strings (math-verify's fallback) and matrices of bounded input
    for p in expr.atoms(sympy.Pow):
        e = p.exp
        if not (e.is_Number and abs(e) <= _MAX_EXPONENT) or p.base.has(sympy.Pow):
            return False
    return not any(
        isinstance(f, sympy.functions.combinatorial.factorials.CombinatorialFunction)
        or f.func.__name__ in ("gamma", "loggamma", "polygamma")
        for f in expr.atoms(sympy.Function)
    )


@functools.lru_cache(maxsize=8192)
def math_parse(text: str) -> tuple[Any, ...]:
    """What math-verify parses from `text` (its last `MATH_MAX_CHARS` characters), without
    signal-based timeouts (safe in any thread); `()` when nothing parses or it is not tame."""
    from math_verify import parse

    with _MATH_LOCK:
        parsed = parse(text[-MATH_MAX_CHARS:], parsing_timeout=None)
    return tuple(parsed) if all(_tame(x) for x in parsed) else ()


def _is_number(expr: Any) -> bool:
    """A final answer is a number: `8`, `-3`, `4.0`, a fraction `3/4` (or `50%`), or text
    sympy could not read (math-verify then compares strings). Not an expression left for
    the grader to evaluate: math-verify would call `6 - 6` equal to 0, and a reviser trained
    on that learned to copy the question's numbers and skip the arithmetic."""
    import sympy

    if isinstance(expr, str | sympy.Number):
        return True
    if isinstance(expr, sympy.Mul) and len(expr.args) == 2:
        a, b = expr.args
        return (
            isinstance(a, sympy.Number)
            and isinstance(b, sympy.Pow)
            and isinstance(b.base, sympy.Integer)
            and b.exp == -1
        )
    return False


@functools.lru_cache(maxsize=8192)
def _math_equal(reference: str, text: str) -> bool:
    from math_verify import verify

    gold, pred = math_parse(reference), math_parse(text)
    if not gold or not pred or not _is_number(pred[0]):
        return False
    with _MATH_LOCK:
        return bool(verify(list(gold), list(pred), timeout_seconds=None))


def math_correct(text: str, task: TaskItem) -> bool:
    """Whether `text`'s final answer is a number equal to the task's reference (math-verify
    equivalence: "4", "4.0", "The answer is 4", "#### 4", "2 + 2 = 4", "8/2" all equal
    "…\\n#### 4"; "2 + 2" and "2^2" do not: they are expressions, not answers)."""
    return _math_equal(math_reference(task.answer), text)


@on_warm_up("math_answer", "math_verdict")
def _warm_up() -> None:
    math_correct("3 + 1 = 4", TaskItem("warm-up", "", "#### 4"))


math_answer = answer_reward(
    "math_answer",
    math_correct,
    "1 if the final answer math-verify parses from the response equals the reference.",
)
math_verdict = verdict_reward(
    "math_verdict",
    math_correct,
    "1 if the verifier says `yes` to a `target` parent whose answer math-verify finds right, "
    "or `no` to a wrong one; 0 for anything else (`verdict` with `math_correct`).",
)
