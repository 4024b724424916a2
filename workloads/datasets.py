"""Task datasets: seeded synthetic generators with verifiable answers, and user files.

A `TaskItem` is one episode's input. Generators are registered by name and are pure functions
of (params, size, seed), so a run and its resume see the same tasks. User datasets are JSONL or
Parquet at any fsspec URL (`file://`, `s3://`, ...), with configurable field names; the answer
is compared as a string by the reward functions.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec

from meg.registry import Registry
from meg.spec import DatasetSpec


class DatasetError(ValueError):
    """A dataset cannot be built or read; the message names the source and the fix."""


@dataclass(frozen=True, slots=True)
class TaskItem:
    id: str
    question: str
    answer: str


Episode = tuple[str, TaskItem]  # (episode id, task): what the driver hands a generate task


@dataclass(frozen=True, slots=True)
class Splits:
    train: tuple[TaskItem, ...]
    eval: tuple[TaskItem, ...]


Generator = Callable[..., list[tuple[str, str]]]  # (rng, size, **params) -> [(q, a)]
GENERATORS: Registry[Generator] = Registry(
    "dataset generator", importable=True, builtins=("workloads.code_tasks",)
)


def register_generator(name: str) -> Callable[[Generator], Generator]:
    """`@register_generator("name")` on `fn(rng: random.Random, size, **params)` returning
    `(question, answer)` pairs; `generator: my_module:my_fn` names one of your own."""
    return GENERATORS.register(name)


@register_generator("arithmetic")
def arithmetic(
    rng: random.Random, size: int, *, max_operand: int = 9, ops: str = "+", terms: int = 2
) -> list[tuple[str, str]]:
    """`a+b` style questions; with the defaults answers are 0..18 (one or two tokens)."""
    out = []
    for _ in range(size):
        xs = [rng.randint(0, max_operand) for _ in range(terms)]
        q, value = str(xs[0]), xs[0]
        for x in xs[1:]:
            op = rng.choice(ops)
            q += f"{op}{x}"
            value = value + x if op == "+" else value - x if op == "-" else value * x
        out.append((q, str(value)))
    return out


def _generate(spec: DatasetSpec) -> Splits:
    name = spec.generator or ""
    try:
        fn = GENERATORS.get(name)
    except KeyError as e:
        raise DatasetError(str(e)) from None
    rng = random.Random(spec.seed)
    try:
        pairs = fn(rng, spec.train_size + spec.eval_size, **spec.params)
    except TypeError as e:
        raise DatasetError(f"bad params for generator {name!r}: {e}") from None
    items = [TaskItem(f"{name}-{i}", q, a) for i, (q, a) in enumerate(pairs)]
    return Splits(tuple(items[: spec.train_size]), tuple(items[spec.train_size :]))


def _read_records(url: str) -> list[dict[str, Any]]:
    try:
        if url.endswith(".parquet"):
            import pyarrow.parquet as pq

            with fsspec.open(url, "rb") as f:
                return list(pq.read_table(f).to_pylist())
        with fsspec.open(url, "rt") as f:
            lines = list(f)
    except FileNotFoundError:
        raise DatasetError(f"dataset {url!r} does not exist") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetError(f"dataset {url!r}: line {number} is not JSON: {e.msg}") from None
    return records


def _from_url(spec: DatasetSpec) -> Splits:
    url = spec.url or ""
    rows = _read_records(url)
    items = []
    for i, row in enumerate(rows):
        for fld in (spec.question_field, spec.answer_field):
            if fld not in row:
                raise DatasetError(
                    f"dataset {url!r}, record {i}: no field {fld!r} (fields: {sorted(row)}); "
                    "set dataset.question_field / dataset.answer_field"
                )
        items.append(
            TaskItem(
                str(row.get("id", i)), str(row[spec.question_field]), str(row[spec.answer_field])
            )
        )
    random.Random(spec.seed).shuffle(items)
    n_eval = min(spec.eval_size, len(items) // 5)
    train = items[n_eval:][: spec.train_size]
    if not train:
        raise DatasetError(f"dataset {url!r} has no training records")
    return Splits(tuple(train), tuple(items[:n_eval]))


def load_dataset(spec: DatasetSpec) -> Splits:
    return _generate(spec) if spec.generator else _from_url(spec)


def batch_for_step(splits: Splits, step: int, size: int, seed: int) -> list[TaskItem]:
    """The episodes of `step`: a deterministic function of (step, seed), so resume is exact."""
    rng = random.Random(seed * 1_000_003 + step)
    return [splits.train[rng.randrange(len(splits.train))] for _ in range(size)]
