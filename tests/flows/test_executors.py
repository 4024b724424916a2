"""The driver submits task bodies by name: it never imports them, nor torch's model stack."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flows.executors import TASKS, task_of


def test_the_driver_imports_no_model_stack() -> None:
    """`flexmarl train`'s modules load without transformers, vLLM or the training and
    scoring bodies (they cost ~6 s of CPU per command and are imported on the workers;
    `tasks.rollout` is light and the planner needs its `Episode`)."""
    code = (
        "import sys, flows.train, flows.commands\n"
        "heavy = ('transformers', 'vllm', 'peft', 'tasks.training', 'tasks.scoring',"
        " 'engines.training.trainer')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported on the driver: {out.stdout.strip()}"


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_every_kind_names_a_prefect_task(kind: str) -> None:
    task = task_of(kind)
    assert task.fn.__name__ == TASKS[kind][1] and hasattr(task, "submit")


def test_an_unknown_kind_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        task_of("evaluate")
