"""Grade-school word problems in the GSM8K format, from a seeded generator or a file.

`word_problems` (registered as the dataset generator `word_problems`) writes short
templated stories — a person, a kind of object, small numbers, one or more events that add,
take away or multiply — and their answers the way GSM8K writes them: a short worked
solution, one equation per line, ending with `#### <number>`::

    Q: Ava has 5 shells. Ava finds 3 more. How many shells does Ava have now?
    A: 5 + 3 = 8
       #### 8

The templates are this project's own. With the defaults (one addition or subtraction on
numbers up to 9) a tiny random-init model learns the format in a short warm start and then
gets a fraction of the answers right, which RL can improve. `steps`, `max_number` and
`ops` make the problems harder (two or three events, larger numbers, multiplication).

Because the answer format is GSM8K's, the same workload reads a real GSM8K file
(`{"question": ..., "answer": "...\\n#### 72"}` per line) from any fsspec URL: point
`dataset:` at it with `url:`, `question_field: question`, `answer_field: answer`.
`write_jsonl` writes such a file (from generated problems or any pairs), for tests and for
trying the `url:` path. The rewards (`math_answer`, `math_verdict` in `workloads.rewards`)
compare the number after `####` with what math-verify parses from a response.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Sequence

import fsspec

from workloads.datasets import register_generator

NAMES = (
    "Ava", "Ben", "Cara", "Dev", "Ella", "Finn", "Gia", "Hugo",
    "Ivy", "Jack", "Kai", "Lena", "Max", "Nora", "Omar", "Pia",
)  # fmt: skip
OBJECTS = (
    "apples", "pens", "marbles", "stickers", "books", "cookies",
    "shells", "cards", "coins", "balloons", "eggs", "stamps",
)  # fmt: skip
CONTAINERS = ("bags", "boxes", "jars", "packs")

# What starts a story (the first amount), an event that adds, one that takes away, the
# question. `{n}` is the event's number, `{friend}` another person of the story.
STARTS = ("{name} has {n} {obj}.", "{name} starts with {n} {obj}.")
ADD = (
    "{name} buys {n} more {obj}.",
    "{name} finds {n} more {obj}.",
    "{friend} gives {name} {n} more {obj}.",
    "{name} gets {n} more {obj} from {friend}.",
)
TAKE = (
    "{name} gives {n} {obj} to {friend}.",
    "{name} loses {n} {obj}.",
    "{name} sells {n} {obj}.",
    "{friend} takes {n} {obj} from {name}.",
)
GROUPS = "{name} has {a} {box} with {b} {obj} in each."  # a multiplication as the start
QUESTIONS = (
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have in the end?",
)
OPS = "+-*"


def _noun(n: int, plural: str) -> str:
    """`1 shell`, `2 shells` (every object here makes its plural with an `s`)."""
    return plural[:-1] if n == 1 else plural


def _solve_line(a: int, op: str, b: int) -> tuple[str, int]:
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a} {op} {b} = {value}", value


def word_problem(
    rng: random.Random, *, steps: int = 1, max_number: int = 9, ops: str = "+-"
) -> tuple[str, str]:
    """One problem and its GSM8K-format answer (worked lines, then `#### <number>`).

    `steps` events after the start, each an addition or a subtraction (`+`/`-` in `ops`);
    with `*` in `ops` the story may start with groups (`3 bags with 4 pens in each`), one
    more line of the solution. Numbers are 1..`max_number`; amounts never go below zero."""
    name, friend = rng.sample(NAMES, 2)
    obj = rng.choice(OBJECTS)
    sentences, lines = [], []
    if "*" in ops and rng.random() < 0.5:
        a, b = rng.randint(2, max_number), rng.randint(2, max_number)
        box = rng.choice(CONTAINERS)
        sentences.append(GROUPS.format(name=name, a=a, b=b, box=box, obj=obj))
        line, value = _solve_line(a, "*", b)
        lines.append(line)
    else:
        value = rng.randint(1, max_number)
        sentences.append(rng.choice(STARTS).format(name=name, n=value, obj=_noun(value, obj)))
    arith = [op for op in "+-" if op in ops] or ["+"]
    for _ in range(steps):
        op = rng.choice(arith) if value > 0 else "+"
        n = rng.randint(1, min(value, max_number)) if op == "-" else rng.randint(1, max_number)
        template = rng.choice(ADD if op == "+" else TAKE)
        sentences.append(template.format(name=name, friend=friend, n=n, obj=_noun(n, obj)))
        line, value = _solve_line(value, op, n)
        lines.append(line)
    sentences.append(rng.choice(QUESTIONS).format(name=name, obj=obj))
    return " ".join(sentences), "\n".join([*lines, f"#### {value}"])


@register_generator("word_problems")
def word_problems(
    rng: random.Random, size: int, *, steps: int = 1, max_number: int = 9, ops: str = "+-"
) -> list[tuple[str, str]]:
    """`size` seeded word problems (see `word_problem` for the params)."""
    if steps < 1 or max_number < 2:
        raise TypeError(f"need steps >= 1 and max_number >= 2 (got {steps}, {max_number})")
    if not ops or set(ops) - set(OPS):
        raise TypeError(f"ops must be a non-empty string of {OPS!r} (got {ops!r})")
    return [word_problem(rng, steps=steps, max_number=max_number, ops=ops) for _ in range(size)]


def write_jsonl(
    url: str,
    pairs: Iterable[tuple[str, str]],
    *,
    question_field: str = "question",
    answer_field: str = "answer",
) -> int:
    """Write `(question, answer)` pairs as GSM8K-style JSONL (one `{"question", "answer"}`
    object a line) to a path or any fsspec URL; returns the number of records."""
    count = 0
    with fsspec.open(url, "wt", encoding="utf-8") as f:
        for q, a in pairs:
            f.write(json.dumps({question_field: q, answer_field: a}) + "\n")
            count += 1
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workloads.word_problems OUT.jsonl [--size N --seed S --steps K ...]`."""
    p = argparse.ArgumentParser(description="Write generated word problems as GSM8K JSONL.")
    p.add_argument("out", help="path or fsspec URL of the JSONL file")
    p.add_argument("--size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--max-number", type=int, default=9)
    p.add_argument("--ops", default="+-")
    args = p.parse_args(argv)
    pairs = word_problems(
        random.Random(args.seed),
        args.size,
        steps=args.steps,
        max_number=args.max_number,
        ops=args.ops,
    )
    print(f"{write_jsonl(args.out, pairs)} problems written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
