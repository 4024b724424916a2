"""The driver submits task bodies by name: it never imports them, nor torch's model stack."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.orchestrator.executors import TASKS, task_of


def test_the_driver_imports_no_model_stack() -> None:
    """`flexmarl train`'s modules and every command's options (what `flexmarl --help` and
    each command build at start) load without torch, transformers, vLLM or the task bodies
    (they cost seconds of CPU per command and are imported on the workers; `evaluate`'s
    options once pulled in torch through its flow's scoring)."""
    code = (
        "import sys, flows.train, flows.cli.main\n"
        "flows.cli.main.build_parser()\n"
        "heavy = ('torch', 'transformers', 'vllm', 'peft', 'tasks.rollout', 'tasks.training',"
        " 'tasks.scoring', 'engines.training.trainer')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported on the driver: {out.stdout.strip()}"


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_every_kind_names_a_prefect_task(kind: str) -> None:
    task = task_of(kind)
    assert task.fn.__name__ == kind == task.name and hasattr(task, "submit")


def test_an_unknown_kind_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        task_of("evaluate")


PLAN_A_RUN = """
import json, sys
from flows.cluster.start import Workers
from flows.orchestrator.pipeline import Pipeline
from flows.train import TrainParams, check, prepare

params = TrainParams(config=sys.argv[1], run_dir=sys.argv[2], mode="sync", micro_batches=2)
check(params)
run = prepare(params)  # writes run.json and opens the store


class Recorder:
    def __init__(self):
        self.kinds = []

    def submit(self, kind, kwargs, pin):
        self.kinds.append(kind)
        return object()

    def done(self, handle):
        return False


workers = Workers("tcp://s", ("R",), ("T",), {w: {"resources": {w: 1}} for w in "RT"})
ex = Recorder()
pipe = Pipeline(run.ctx, workers, ex)
pipe.submit_rollout(0)
pipe.submit_training(0)
loaded = [m for m in ("torch", "transformers", "vllm", "peft") if m in sys.modules]
print(json.dumps({"kinds": sorted(set(ex.kinds)), "loaded": loaded, "mode": run.ctx.mode}))
"""


def test_planning_a_run_in_the_driver_leaves_torch_out(tmp_path: Path, tiny_model: str) -> None:
    """Check, prepare (run.json, the store) and compile a step's tasks, as `flexmarl train`
    does before any worker runs: no torch, transformers, vLLM or peft in the driver."""
    from tests.flows.conftest import write_config

    cfg = write_config(tmp_path / "cfg", tiny_model)
    code = textwrap.dedent(PLAN_A_RUN)
    out = subprocess.run(
        [sys.executable, "-c", code, str(cfg), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["kinds"] == ["generate", "optimizer_step", "score", "train_micro_batch"]
    assert got["mode"] == "sync"  # the command line's override, resolved once
    assert got["loaded"] == []
