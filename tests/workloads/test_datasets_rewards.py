"""Datasets (synthetic generators, JSONL/Parquet from fsspec URLs) and reward functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meg.spec import DatasetSpec
from workloads.datasets import DatasetError, TaskItem, batch_for_step, load_dataset
from workloads.rewards import (
    EpisodeView,
    SampleView,
    extract_answer,
    get_reward,
    known_rewards,
    register_reward,
    reward_reads,
)


def test_arithmetic_is_seeded_and_verifiable() -> None:
    spec = DatasetSpec(generator="arithmetic", train_size=50, eval_size=10, seed=3)
    a, b = load_dataset(spec), load_dataset(spec)
    assert a == b and len(a.train) == 50 and len(a.eval) == 10
    for t in a.train:
        x, y = t.question.split("+")
        assert int(x) + int(y) == int(t.answer)
    assert load_dataset(spec.model_copy(update={"seed": 4})).train != a.train
    assert batch_for_step(a, 2, 8, seed=0) == batch_for_step(a, 2, 8, seed=0)
    assert batch_for_step(a, 2, 8, seed=0) != batch_for_step(a, 3, 8, seed=0)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_user_dataset_from_url_with_custom_fields(tmp_path: Path, fmt: str) -> None:
    rows = [{"q": f"{i}+1", "a": str(i + 1)} for i in range(30)]
    path = tmp_path / f"tasks.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    spec = DatasetSpec(url=path.as_uri(), question_field="q", answer_field="a", eval_size=5)
    s = load_dataset(spec)
    assert len(s.train) + len(s.eval) == 30 and len(s.eval) == 5
    assert {(t.question, t.answer) for t in (*s.train, *s.eval)} == {(r["q"], r["a"]) for r in rows}


def test_dataset_errors_name_the_source(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(DatasetSpec(url=(tmp_path / "none.jsonl").as_uri()))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1", "answer": "1"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"line 2 is not JSON"):
        load_dataset(DatasetSpec(url=bad.as_uri()))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"prompt": "1", "answer": "1"}\n')
    with pytest.raises(DatasetError, match=r"no field .question.*question_field"):
        load_dataset(DatasetSpec(url=wrong.as_uri()))
    with pytest.raises(DatasetError, match="unknown dataset generator 'nope'; known: arithmetic"):
        load_dataset(DatasetSpec(generator="nope"))


def _episode(*samples: SampleView) -> EpisodeView:
    return EpisodeView({s.id: s for s in samples})


TASK = TaskItem("t", "3+4", "7")


def test_exact_answer_and_verdict() -> None:
    right = SampleView("e/solve/0/0", "solve", " 7", ())
    wrong = SampleView("e/solve/0/1", "solve", " 8 because", ())
    yes_r = SampleView("e/verify/0/0", "verify", " yes", (right.id,))
    no_r = SampleView("e/verify/0/1", "verify", " no", (right.id,))
    no_w = SampleView("e/verify/1/0", "verify", " no", (wrong.id,))
    junk = SampleView("e/verify/1/1", "verify", " maybe", (wrong.id,))
    ep = _episode(right, wrong, yes_r, no_r, no_w, junk)
    exact, verdict = get_reward("exact_answer"), get_reward("verdict")
    assert (exact(right, ep, TASK), exact(wrong, ep, TASK)) == (1.0, 0.0)
    assert [verdict(s, ep, TASK, target="solve") for s in (yes_r, no_r, no_w, junk)] == [
        1.0,
        0.0,
        1.0,
        0.0,
    ]
    assert extract_answer(" -12 or 3") == "-12" and extract_answer("none") is None


def test_team_final_credits_what_fed_the_final_answer() -> None:
    a0 = SampleView("e/a/0/0", "a", " 7", ())
    a1 = SampleView("e/a/0/1", "a", " 1", ())
    f0 = SampleView("e/final/0/0", "final", " 7", (a0.id,))
    f1 = SampleView("e/final/0/1", "final", " 7", (a0.id,))
    ep = _episode(a0, a1, f0, f1)
    team = get_reward("team_final")
    assert team(a0, ep, TASK, final="final") == 1.0  # both finals descend from a0 and are right
    assert team(a1, ep, TASK, final="final") == 1.0  # fed nothing: gets the team outcome
    with pytest.raises(ValueError, match="no sample of node 'judge'"):
        team(a0, ep, TASK, final="judge")


def test_unknown_reward_lists_known() -> None:
    with pytest.raises(
        KeyError, match="unknown reward function 'x'; known: " + ", ".join(known_rewards())
    ):
        get_reward("x")


@register_reward("test_whole_episode")  # a third-party reward that declares nothing
def _whole_episode(sample: SampleView, episode: EpisodeView, task: TaskItem, **_: Any) -> float:
    return 0.0


def test_rewards_declare_what_they_read() -> None:
    """What a reward reads decides when its node can be scored (`meg.score_groups`)."""
    assert reward_reads("exact_answer", {}) == frozenset()
    assert reward_reads("length_penalty", {"max_chars": 9}) == frozenset()
    assert reward_reads("verdict", {"target": "solve"}) == {"solve"}
    assert reward_reads("team_final", {"final": "judge"}) == {"judge"}
    assert reward_reads("test_whole_episode", {}) is None  # undeclared: the whole episode
    with pytest.raises(ValueError, match="reward 'team_final' needs the parameter 'final'"):
        reward_reads("team_final", {})
    with pytest.raises(KeyError, match="unknown reward function 'nope'"):
        reward_reads("nope", {})
