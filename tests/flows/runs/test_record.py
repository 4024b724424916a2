"""run.json: the resolved record a run is resumed from, in this format and the one before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.runs.config import load_config
from flows.runs.record import FORMAT, Run, RunError, default_store, load_run
from tasks.context import RunContext
from tests.flows.conftest import write_config


def test_a_record_round_trips_with_its_sources(tmp_path: Path, tiny_model: str) -> None:
    spec = load_config(str(write_config(tmp_path, tiny_model))).with_run(mode="async", staleness=1)
    run_dir = tmp_path / "run"
    ctx = RunContext("r1", default_store(run_dir), spec, train_slots=3)
    Run(run_dir, ctx, {"mode": "cli"}).save()
    back = load_run(run_dir)
    assert json.loads((run_dir / "run.json").read_text())["format"] == FORMAT
    assert back.ctx == ctx and back.sources == {"mode": "cli"}
    assert (back.ctx.mode, back.ctx.staleness, back.ctx.train_slots) == ("async", 1, 3)


def test_a_format_1_record_is_read_with_its_settings_beside_the_spec(
    tmp_path: Path, tiny_model: str
) -> None:
    """Runs recorded before 2026-12-05 kept mode, steps, ... next to the spec, whose `run`
    still held the MEG's values (and `checkpoint_every` 0 for "every step")."""
    spec = load_config(str(write_config(tmp_path, tiny_model)))
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    data = spec.model_dump(mode="json")
    data["run"]["checkpoint_every"] = 0
    old = {
        "format": 1,
        "run_id": "old-run",
        "store_url": default_store(run_dir),
        "storage_options": None,
        "spec": data,
        "mode": "sync",
        "staleness": 0,
        "seed": 7,
        "train_slots": 2,
        "checkpoint_every": 1,
        "steps": 5,
        "episodes_per_step": 4,
        "micro_batches": 2,
        "window": 1,
        "balance": False,
    }
    (run_dir / "run.json").write_text(json.dumps(old))
    ctx = load_run(run_dir).ctx
    assert (ctx.mode, ctx.seed, ctx.steps, ctx.checkpoint_every) == ("sync", 7, 5, 1)
    assert (ctx.run.window, ctx.run.balance, ctx.keep_checkpoints) == (1, False, 2)
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(RunError, match="not a valid run record"):
        load_run(run_dir)


def test_a_directory_taken_between_check_and_prepare_is_refused(
    tmp_path: Path, tiny_model: str
) -> None:
    from flows.train import TrainParams, check, prepare

    cfg = write_config(tmp_path / "cfg", tiny_model)
    params = TrainParams(config=str(cfg), run_dir=str(tmp_path / "run"))
    settled = check(params)  # what `prepare` will record
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")  # another run took the directory
    with pytest.raises(RunError, match="already holds a run"):
        prepare(params, settled)


def test_a_save_that_dies_midway_leaves_the_record_it_had(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json is replaced whole: a run killed while rewriting it (continued to more
    steps) still resumes from the record before, never from half a file."""
    spec = load_config(str(write_config(tmp_path, tiny_model)))
    run_dir = tmp_path / "run"
    ctx = RunContext("r1", default_store(run_dir), spec)
    Run(run_dir, ctx, {"steps": "meg"}).save()
    before = (run_dir / "run.json").read_text()

    def dies(self: Path, text: str) -> int:  # the write is cut off after half the text
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise OSError("killed mid-write")

    monkeypatch.setattr(Path, "write_text", dies)
    with pytest.raises(OSError, match="mid-write"):
        Run(run_dir, ctx, {"steps": "cli"}).save()
    monkeypatch.undo()
    assert (run_dir / "run.json").read_text() == before
    assert load_run(run_dir).sources == {"steps": "meg"}
