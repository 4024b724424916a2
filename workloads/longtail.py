"""A long-tail workload: tasks whose right answers have heavy-tailed lengths.

In RL for LLMs a step waits for its longest response; this workload makes that tail
explicit and controllable. A task asks for the integers from `a` to `b` (`"list 7..12"` →
`"7 8 9 10 11 12"`); the count `b − a + 1` is drawn from a Pareto distribution (scale
`min_count`, shape `alpha`), capped at `max_count`, so most answers are a few numbers and
a few run to the cap — the shape of real reasoning-length distributions, with a known
right answer of every length. A warm start on it (`flexmarl tiny-model DIR --warm-start
workloads/longtail.yaml`) teaches the format, so the rollout's response lengths inherit the
tail (`docs/workloads.md` has the measured p50 / p99).

Registers (as a plug-in the MEG lists under `plugins:`):

- the generator `longtail` (params `min_count`, `alpha`, `max_count`, `max_start`);
- the rewards `sequence` (1 when the response's integers are exactly the answer's) and
  `sequence_verdict` (a checker's `yes`/`no` on a `target` node's list, the `verdict` rule);
- their warm-start references: the full list, and the verdict on what the checker is shown
  (half the right lists shown with their tail cut off).
"""

from __future__ import annotations

import random
import re

from workloads.datasets import TaskItem, register_generator
from workloads.rewards import answer_reward, verdict_reward
from workloads.warm_start import REFERENCES

_INTS = re.compile(r"-?\d+")


def pareto_count(rng: random.Random, *, min_count: int, alpha: float, max_count: int) -> int:
    """⌊min_count / U^(1/alpha)⌋ for U uniform in (0, 1], capped at `max_count`: a discrete
    Pareto with P(count ≥ x) ≈ (min_count / x)^alpha."""
    u = 1.0 - rng.random()  # (0, 1]
    return min(max_count, int(min_count / u ** (1.0 / alpha)))


@register_generator("longtail")
def longtail(
    rng: random.Random,
    size: int,
    *,
    min_count: int = 2,
    alpha: float = 1.2,
    max_count: int = 40,
    max_start: int = 40,
) -> list[tuple[str, str]]:
    """`size` tasks `"list a..b"` → `"a a+1 … b"`, counts heavy-tailed (see module doc)."""
    if not 1 <= min_count <= max_count or alpha <= 0 or max_start < 0:
        raise TypeError(
            "need 1 <= min_count <= max_count, alpha > 0, max_start >= 0 (got "
            f"{min_count}, {max_count}, {alpha}, {max_start})"
        )
    out = []
    for _ in range(size):
        n = pareto_count(rng, min_count=min_count, alpha=alpha, max_count=max_count)
        a = rng.randint(0, max_start)
        out.append((f"list {a}..{a + n - 1}", " ".join(str(x) for x in range(a, a + n))))
    return out


def sequence_correct(text: str, task: TaskItem) -> bool:
    """The response's integers are exactly the answer's, in order (nothing missing or
    added; the words between them do not matter)."""
    return _INTS.findall(text) == _INTS.findall(task.answer)


def sequence_wrong_already(text: str, task: TaskItem) -> bool:
    """`sequence_correct` is False whatever follows: an integer already complete (a
    non-digit follows it) differs from the answer's at its place, or there are more of them
    than the answer has. A right prefix is never decided (one more integer makes it wrong)."""
    done = [m.group(0) for m in _INTS.finditer(text) if m.end() < len(text)]
    want = _INTS.findall(task.answer)
    return len(done) > len(want) or done != want[: len(done)]


sequence = answer_reward(
    "sequence",
    sequence_correct,
    "1 if the response lists exactly the answer's integers, in order.",
    decided=sequence_wrong_already,
)
sequence_verdict = verdict_reward(
    "sequence_verdict",
    sequence_correct,
    "1 if the checker says `yes` to a complete `target` list or `no` to a wrong one.",
)


def _full_list(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    return f" {task.answer}"


def _cut_shown(completion: str, task: TaskItem, rng: random.Random) -> str:
    """What a checker is shown: half the right lists with their last numbers cut off (an
    incomplete list, the failure a long-tail rollout stopped early makes); a one-number
    list gets a wrong number instead."""
    numbers = completion.split()
    if not sequence_correct(completion, task) or rng.random() >= 0.5:
        return completion
    if len(numbers) == 1:
        return f" {int(numbers[0]) + rng.choice([1, 2])}"
    keep = rng.randint(1, len(numbers) - 1)
    return " " + " ".join(numbers[:keep])


def _verdict_on_shown(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    judged = next(iter(parents.values()), "")
    return " yes" if sequence_correct(judged, task) else " no"


REFERENCES.add("sequence", _full_list, shown=_cut_shown)
REFERENCES.add("sequence_verdict", _verdict_on_shown)
