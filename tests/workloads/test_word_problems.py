"""The word-problems workload: its generator, GSM8K-format files, its MEG, its warm start."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from flows.runs.config import load_config
from meg.registry import Registry
from meg.spec import DatasetSpec
from workloads import BUILTIN
from workloads.datasets import DatasetError, TaskItem, load_dataset
from workloads.math_rewards import math_correct, math_reference
from workloads.warm_start import (
    PRESET_STEPS,
    REFERENCES,
    _math_shown,
    math_completion,
    reference_pairs,
)
from workloads.word_problems import word_problems, write_jsonl

LINE = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)$")


def _check_worked(answer: str) -> int:
    """Every line `a op b = c` is right and chains into the next; returns the `####` value."""
    *lines, last = answer.split("\n")
    assert last.startswith("#### ") and lines
    value = None
    for line in lines:
        m = LINE.match(line)
        assert m, line
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        assert c == (a + b if op == "+" else a - b if op == "-" else a * b) >= 0
        if value is not None:
            assert a == value  # the next step starts from the previous result
        value = c
    assert last == f"#### {value}"
    return int(last.removeprefix("#### "))


@pytest.mark.parametrize(
    "params",
    [{}, {"steps": 2}, {"steps": 3, "max_number": 20, "ops": "+-*"}, {"ops": "+"}],
)
def test_generator_is_seeded_and_answers_are_right(params: dict[str, Any]) -> None:
    a = word_problems(random.Random(5), 200, **params)
    assert a == word_problems(random.Random(5), 200, **params)
    assert a != word_problems(random.Random(6), 200, **params)
    steps = params.get("steps", 1)
    for q, ans in a:
        assert q.endswith("?") and re.search(r"\d", q)
        lines = ans.split("\n")
        assert len(lines) - 1 in (steps, steps + 1)  # +1: a multiplication start
        value = _check_worked(ans)
        assert math_reference(ans) == str(value)
        assert math_correct(f" {value}", TaskItem("t", q, ans))
        if params.get("ops") == "+":
            assert "-" not in ans and "*" not in ans
    if "*" in params.get("ops", ""):
        assert any("*" in ans for _, ans in a)


def test_generator_params_are_checked() -> None:
    for bad in ({"steps": 0}, {"ops": "/"}, {"max_number": 1}):
        with pytest.raises(DatasetError, match="bad params for generator 'word_problems'"):
            load_dataset(DatasetSpec(generator="word_problems", params=bad))


def test_dataset_of_the_builtin_workload() -> None:
    spec = load_config("word-problems", check_models=False)
    s = load_dataset(spec.dataset)
    assert len(s.train) == 2000 and len(s.eval) == 128
    assert not {t.question for t in s.eval} <= {t.question for t in s.train}
    assert all("\n#### " in t.answer for t in (*s.train, *s.eval))


def test_jsonl_round_trip_through_the_url_dataset(tmp_path: Path) -> None:
    pairs = word_problems(random.Random(0), 50, steps=2)
    path = tmp_path / "gsm8k.jsonl"
    assert write_jsonl(str(path), pairs) == 50
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"question", "answer"} and first["answer"].split("\n")[-1][:5] == "#### "
    spec = DatasetSpec(
        url=path.as_uri(), question_field="question", answer_field="answer", eval_size=10
    )
    s = load_dataset(spec)
    assert len(s.eval) == 10 and len(s.train) == 40
    assert sorted((t.question, t.answer) for t in (*s.train, *s.eval)) == sorted(pairs)
    assert s == load_dataset(spec)  # seeded split


def test_builtin_yaml_with_a_url_dataset(tmp_path: Path) -> None:
    """The YAML's commented `url:` recipe: the same MEG reads a GSM8K-format file."""
    import yaml

    path = tmp_path / "gsm8k.jsonl"
    write_jsonl(
        str(path), [("Tom has 3 cups and buys 2 more. How many?", "3 + 2 = 5\n#### 5")] * 20
    )
    data = yaml.safe_load(BUILTIN["word-problems"].read_text())
    data["dataset"] = {"url": path.as_uri(), "question_field": "question", "answer_field": "answer"}
    cfg = tmp_path / "wp.yaml"
    cfg.write_text(yaml.safe_dump(data))
    s = load_dataset(load_config(str(cfg), check_models=False).dataset)
    assert len(s.train) == 16 and s.train[0].answer == "3 + 2 = 5\n#### 5"


def test_builtin_meg_validates() -> None:
    spec = load_config("word-problems", check_models=False)
    assert set(spec.nodes) == {"solve", "verify", "revise"}
    assert spec.team_nodes == ["revise"]
    assert spec.rewards["verify"].fn == "math_verdict"
    assert spec.rewards["verify"].params == {"target": "solve"}
    assert {spec.rewards[n].fn for n in ("solve", "revise")} == {"math_answer"}
    assert spec.dataset.generator == "word_problems"
    assert spec.run.steps > 0 and "word-problems" in PRESET_STEPS


def test_warm_start_references_for_the_three_nodes() -> None:
    assert isinstance(REFERENCES, Registry)
    assert {"exact_answer", "verdict", "math_answer", "math_verdict"} <= set(REFERENCES)
    spec = load_config("word-problems", check_models=False)
    tasks = load_dataset(spec.dataset).train[:64]
    rng = random.Random(0)
    verdicts = []
    for task in tasks:
        solve, verify, revise = reference_pairs(spec, task, rng)
        assert solve.completion == revise.completion == math_completion(task)
        assert LINE.match(solve.completion.strip()) and math_correct(solve.completion, task)
        shown = verify.parents["solve"]
        assert verify.completion == (" yes" if math_correct(shown, task) else " no")
        assert revise.parents == {"verify": verify.completion, "solve": shown}
        assert "{" not in revise.prompt and revise.prompt.endswith("\nFinal:")
        verdicts.append(verify.completion)
    assert 0.3 < verdicts.count(" no") / len(verdicts) < 0.7  # both verdicts are taught


TASK = TaskItem("t", "Ava has 3 pens. Ava buys 1 more pen. How many pens?", "3 + 1 = 4\n#### 4")


def test_math_completion_of_long_and_short_answers() -> None:
    assert math_completion(TASK) == " 3 + 1 = 4"
    two = TaskItem("t", "q", "5 + 3 = 8\n8 - 2 = 6\n#### 6")
    assert math_completion(two) == " 5 + 3 = 8, 8 - 2 = 6" and math_correct(
        " 5 + 3 = 8, 8 - 2 = 6", two
    )
    long = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    assert math_completion(TaskItem("t", "q", long)) == " 72"
    assert math_completion(TaskItem("t", "q", "18")) == " 18"
    wrong = _math_shown(" 3 + 1 = 4", TASK, random.Random(0))
    corrupted = {_math_shown(" 3 + 1 = 4", TASK, random.Random(s)) for s in range(40)}
    assert (
        " 3 + 1 = 4" in corrupted
        and {" 3 + 1 = 2", " 3 + 1 = 3", " 3 + 1 = 5", " 3 + 1 = 6"} & corrupted
    )
    assert all(c.startswith(" 3 + 1 = ") for c in corrupted) and wrong in corrupted


def test_unknown_reference_names_the_known_ones() -> None:
    spec = load_config("word-problems", check_models=False)
    bad = spec.model_copy(
        update={
            "rewards": {
                **spec.rewards,
                "solve": spec.rewards["solve"].model_copy(update={"fn": "nope"}),
            }
        }
    )
    with pytest.raises(
        KeyError, match=r"no reference completion for reward .nope.; known: .*math_answer"
    ):
        reference_pairs(bad, TASK, random.Random(0))
