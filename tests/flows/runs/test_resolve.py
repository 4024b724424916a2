"""The one merge of a MEG's `run:` with the command line, and what a resume may change."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.main import main
from flows.runs.config import load_config
from flows.runs.record import load_run
from flows.runs.resolve import ResolveError, continued, first_difference, resolve
from flows.train import TrainParams, check, prepare
from meg import MEGSpec
from tests.flows.conftest import write_config


@pytest.fixture
def spec(tmp_path: Path, tiny_model: str) -> MEGSpec:
    return load_config(str(write_config(tmp_path, tiny_model, steps=2, micro_batches=2)))


def test_resolve_applies_given_values_once_and_names_their_sources(spec: MEGSpec) -> None:
    resolved, sources = resolve(spec, {"mode": "async", "staleness": 1, "seed": None})
    assert (resolved.run.mode, resolved.run.staleness) == ("async", 1)
    assert resolved.run.steps == spec.run.steps == 2  # the MEG's own
    assert sources["mode"] == "cli" and sources["steps"] == "meg" and sources["seed"] == "default"
    with pytest.raises(ResolveError, match=r"--window: Input should be greater than or equal"):
        resolve(spec, {"window": 0})
    with pytest.raises(ResolveError, match="must be at least micro_batches"):
        resolve(spec, {"micro_batches": 10_000})
    with pytest.raises(TypeError, match="not run settings"):
        resolve(spec, {"run_dir": "x"})


def test_first_difference_names_the_path() -> None:
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == "a.b[1]"
    assert first_difference({"a": 1}, {"a": 1, "c": 2}) == "c"
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == "a"
    assert first_difference({"a": 1}, {"a": 1}) is None


def test_continued_may_only_grow_steps(spec: MEGSpec) -> None:
    assert continued(spec, {"steps": None, "mode": None}) is spec
    assert continued(spec, {"steps": 5}).run.steps == 5
    assert continued(spec, {"mode": spec.run.mode}) is spec  # the same value is no change
    with pytest.raises(ResolveError, match="add steps, not remove them"):
        continued(spec, {"steps": 1})
    with pytest.raises(ResolveError, match=r"mode 'sync' \(the run's: 'flex'\)"):
        continued(spec, {"mode": "sync"})
    changed = spec.model_copy(update={"description": "edited"})
    with pytest.raises(ResolveError, match="differs from the run's at `description`"):
        continued(spec, {}, changed)
    longer = spec.with_run(steps=4)  # the MEG file given again asks for more steps
    assert continued(spec, {}, longer).run.steps == 4


def test_continued_takes_what_the_run_decided_for_the_meg_given_again(spec: MEGSpec) -> None:
    """`flexmarl train CFG --resume RUN --steps N` with the MEG the run started from: the
    values the run resolved for it (a one-agent run's `checkpoint_every`, `auto` decided
    `on`) are not changes; a value the MEG sets itself still is."""
    recorded = spec.with_run(checkpoint_every=10, rollout_gradients="on")
    assert continued(recorded, {}, spec).run == recorded.run  # the MEG sets neither
    assert continued(recorded, {"rollout_gradients": "auto"}).run == recorded.run
    assert continued(recorded, {"steps": 4}, spec).run.steps == 4
    with pytest.raises(ResolveError, match=r"rollout_gradients 'off' \(the run's: 'on'\)"):
        continued(recorded, {}, spec.with_run(rollout_gradients="off"))
    with pytest.raises(ResolveError, match=r"checkpoint_every 1 \(the run's: 10\)"):
        continued(recorded, {"checkpoint_every": 1})


def test_resume_refusals_and_a_recorded_extension(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything starts: a smaller --steps, a changed setting, a changed MEG are
    refused in one line; a larger --steps is written to run.json by `prepare`."""
    cfg = write_config(tmp_path / "cfg", tiny_model, steps=2, micro_batches=2)
    run_dir = tmp_path / "run"
    new = TrainParams(config=str(cfg), run_dir=str(run_dir))
    check(new)
    prepare(new)  # run.json and the store, as a started run leaves them
    assert load_run(run_dir).sources["steps"] == "meg"
    resume = ["train", "--resume", str(run_dir)]
    assert main([*resume, "--steps", "1"]) == 2
    assert "add steps, not remove them" in capsys.readouterr().err
    assert main([*resume, "--mode", "sync"]) == 2
    assert "--resume keeps the run's settings" in capsys.readouterr().err
    other = write_config(tmp_path / "other", tiny_model, steps=2, micro_batches=2)
    other.write_text(other.read_text().replace("micro_batches: 2", "micro_batches: 1"))
    assert main(["train", str(other), "--resume", str(run_dir)]) == 2
    assert "--resume keeps the run's settings" in capsys.readouterr().err
    run = prepare(TrainParams(resume=str(run_dir), steps=3))
    assert run.ctx.steps == 3 and run.start_step == 0
    recorded = load_run(run_dir)
    assert recorded.ctx.spec.run.steps == 3 and recorded.sources["steps"] == "cli"


def test_a_one_agent_run_checkpoints_every_ten_steps_unless_told(
    spec: MEGSpec, tmp_path: Path, tiny_model: str
) -> None:
    """`graph_defaults`: the interval nobody set depends on the graph; a set one stands."""
    import yaml

    from bench.peer_job import Job, meg_config
    from flows.runs.resolve import SOLO_CHECKPOINT_EVERY

    assert resolve(spec, {})[0].run.checkpoint_every == 1  # math-chain: two agents
    path = meg_config(Job(2, 2, 4, 3), tiny_model, tmp_path)
    solo = load_config(str(path))
    resolved, sources = resolve(solo, {})
    assert resolved.run.checkpoint_every == SOLO_CHECKPOINT_EVERY == 10
    assert sources["checkpoint_every"] == "default"
    assert resolve(solo, {"checkpoint_every": 1})[0].run.checkpoint_every == 1
    data = yaml.safe_load(path.read_text())
    data["run"]["checkpoint_every"] = 2
    path.write_text(yaml.safe_dump(data))
    assert resolve(load_config(str(path)), {})[0].run.checkpoint_every == 2
