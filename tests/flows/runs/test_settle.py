"""A run's settings settled in one stage (`flows.runs.settle`): the override flags generated
from `RunSpec`, one decision per run handed from `check` to `prepare` (no module state), and
run.json written once with every decision in it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import flows.runs.settle as settle_module
import flows.train
from flows.cli.main import build_parser, main
from flows.runs.record import Run, load_run
from flows.runs.resolve import OVERRIDABLE
from flows.runs.settle import Settled
from flows.train import TrainParams, check, prepare, train
from meg.limits import MAX_WINDOW
from meg.spec import RunSpec
from tests.flows.conftest import write_config

BOUNDS_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "type")


def one_node(tmp_path: Path, model: str) -> Path:
    """The TRL peer job's one-node MEG, `backend` and `rollout_gradients` left to the run."""
    from bench.peer_job import Job, meg_config

    tmp_path.mkdir(parents=True, exist_ok=True)
    return meg_config(Job(2, 2, 4, 2), model, tmp_path, backend="auto")


def test_the_override_fields_are_runspecs_own() -> None:
    """Each run setting's type, bounds and description are RunSpec's, default None (not
    given); a value out of bounds is refused, naming the field."""
    ours = TrainParams.model_json_schema()["properties"]
    theirs = RunSpec.model_json_schema()["properties"]
    assert set(OVERRIDABLE) <= set(TrainParams.model_fields) and len(OVERRIDABLE) == 12
    for name in OVERRIDABLE:
        field, spec = TrainParams.model_fields[name], RunSpec.model_fields[name]
        assert field.default is None, name
        assert spec.description and field.description, name
        assert field.description.startswith(spec.description.rstrip(".")), name
        assert f"else {spec.default})" in field.description, name
        value, none = ours[name]["anyOf"]
        assert none == {"type": "null"}, name
        same = {k: v for k, v in theirs[name].items() if k in BOUNDS_KEYS}
        assert {k: v for k, v in value.items() if k in BOUNDS_KEYS} == same, name
    with pytest.raises(ValidationError) as e:
        TrainParams(window=MAX_WINDOW + 1)
    [err] = e.value.errors()
    assert err["loc"] == ("window",) and "less than or equal to 64" in err["msg"]
    with pytest.raises(ValidationError, match="mode"):
        TrainParams(mode="fast")


def test_the_train_flags_show_runspecs_help_and_refuse_out_of_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    train_parser = parser._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    shown = " ".join(train_parser.format_help().split())
    for name in OVERRIDABLE:
        flag = "--" + name.replace("_", "-")
        first = " ".join((RunSpec.model_fields[name].description or "").split()[:4]).rstrip(".")
        assert flag in shown and first in shown, (flag, first)
    for flag, value, why in (
        ("--window", str(MAX_WINDOW + 1), "Input should be less than or equal to 64"),
        ("--staleness", "-1", "Input should be greater than or equal to 0"),
        ("--keep-checkpoints", "0", "Input should be greater than or equal to 1"),
    ):
        assert main(["train", "math-chain", flag, value, "--run-dir", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert f"flexmarl: error: {flag}: {why} (got {int(value)})" in err, err
        assert not (tmp_path / "r").exists()


def test_check_then_prepare_records_its_own_settled_run(tmp_path: Path, tiny_model: str) -> None:
    """Two runs checked in turn each prepare from their own settled value; `prepare`
    decides nothing again; nothing is kept between the calls."""
    cfg = str(write_config(tmp_path / "cfg", tiny_model, steps=2, micro_batches=2))
    sync = TrainParams(config=cfg, run_dir=str(tmp_path / "a"), mode="sync")
    ahead = TrainParams(config=cfg, run_dir=str(tmp_path / "b"), mode="async", staleness=1)
    first, second = check(sync), check(ahead)
    assert isinstance(first, Settled) and first.run.ctx.mode == "sync"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.record = "kept"  # type: ignore[misc]

    def no_second_decision(p: Any) -> Settled:
        raise AssertionError("prepare settled the run again")

    with pytest.MonkeyPatch.context() as m:
        m.setattr("flows.train.settle", no_second_decision)
        assert prepare(ahead, second).dir == tmp_path / "b"
        assert prepare(sync, first).dir == tmp_path / "a"
    assert (load_run(tmp_path / "a").ctx.mode, load_run(tmp_path / "b").ctx.mode) == (
        "sync",
        "async",
    )
    assert load_run(tmp_path / "b").sources["mode"] == "cli"
    # `train(params)` called directly settles for itself: `prepare` without a settled run
    alone = TrainParams(config=cfg, run_dir=str(tmp_path / "c"), mode="sync")
    assert load_run(prepare(alone).dir).ctx.mode == "sync"
    for module in (settle_module, flows.train):  # no checked run kept between calls
        for name, value in vars(module).items():
            if isinstance(value, dict | list | set | tuple) and not name.startswith("__"):
                kept = value.values() if isinstance(value, dict) else value
                assert not any(isinstance(v, Settled | Run) for v in kept), name


def test_run_json_is_written_once_with_the_gradient_decision(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rollout_gradients: auto` is decided with the layout, before run.json is written: one
    write holds it (before, run.json was written with `auto` and again with the decision)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    saves: list[Path] = []
    save = Run.save

    def counted(self: Run) -> None:
        saves.append(self.dir)
        save(self)

    layouts = []
    for_meg = settle_module.for_meg

    def counted_layout(*a: Any, **kw: Any) -> Any:
        layouts.append(a)
        return for_meg(*a, **kw)

    monkeypatch.setattr(Run, "save", counted)
    monkeypatch.setattr(settle_module, "for_meg", counted_layout)
    params = TrainParams(
        config=str(one_node(tmp_path / "cfg", tiny_model)), run_dir=str(tmp_path / "r")
    )
    settled = check(params)
    decided = settled.run.ctx.spec.run.rollout_gradients
    assert decided in ("on", "off") and settled.sources["rollout_gradients"] == "auto"
    assert settled.sources["agents.policy.backend"] == "auto" and "cluster" in settled.sources
    run = prepare(params, settled)
    assert saves == [run.dir] and len(layouts) == 1
    record = json.loads((run.dir / "run.json").read_text())
    assert record["spec"]["run"]["rollout_gradients"] == decided
    assert record["sources"]["rollout_gradients"] == "auto"
    assert record["spec"]["agents"]["policy"]["backend"] in ("hf", "vllm")
    # a resume that changes nothing writes nothing
    resumed = check(TrainParams(resume=str(run.dir)))
    assert resumed.record == "kept"
    prepare(TrainParams(resume=str(run.dir)), resumed)
    assert saves == [run.dir]


def test_the_cli_lays_out_the_cluster_once_and_hands_the_flow_its_decision(
    tmp_path: Path,
    tiny_model: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`flexmarl train` settles the run (the layout included) once, prints what it chose,
    and passes that settled run to the flow."""
    import flows.cluster.start

    class Started(Exception):
        pass

    got: list[tuple[Any, Any]] = []

    def flow(params: TrainParams, settled: Settled | None = None) -> dict[str, Any]:
        got.append((params, settled))
        raise Started

    @contextmanager
    def no_server() -> Iterator[str]:
        yield "http://prefect.invalid/api"

    layouts = []
    for_meg = settle_module.for_meg

    def counted_layout(*a: Any, **kw: Any) -> Any:
        layouts.append(a)
        return for_meg(*a, **kw)

    monkeypatch.setattr(settle_module, "for_meg", counted_layout)
    monkeypatch.setattr(flows.train, "train", flow)
    monkeypatch.setattr(flows.cluster.start, "prefect_api", no_server)
    cfg = one_node(tmp_path / "cfg", tiny_model)
    with pytest.raises(Started):
        main(["train", str(cfg), "--run-dir", str(tmp_path / "r")])
    [(_, settled)] = got
    assert isinstance(settled, Settled) and settled.run.dir == tmp_path / "r"
    assert len(layouts) == 1
    printed = capsys.readouterr().out
    assert all(note in printed for note in settled.notes) and settled.notes


def test_the_flow_shows_deployments_only_its_params() -> None:
    """`train`'s second parameter (a settled run, from the CLI) is not in a deployment's
    form: the schema Prefect builds holds `params` alone, TrainParams' fields included."""
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(train.fn).model_dump()
    assert list(schema["properties"]) == ["params"]
    fields = schema["definitions"]["TrainParams"]["properties"]
    assert set(TrainParams.model_fields) <= set(fields)
    assert fields["window"]["anyOf"][0]["maximum"] == MAX_WINDOW
