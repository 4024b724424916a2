"""Every tool the project or its tests start comes from the running interpreter.

A fresh machine has no `prefect`, `dask`, `flexmarl`, `mkdocs` or `moto_server` on PATH: they
live in the project's virtualenv, which nothing activates. A command that names one of them
bare works only where it happens to be installed globally, and a green CI on such a machine
hid exactly that once (tests/cluster started `prefect server start` by name). So:

- no Python module of the project (package, benchmarks or tests) builds a command whose
  first word is one of these tools: it uses `sys.executable -m ...` instead;
- no recipe of the Makefile or `.ci/run` calls one bare (`$(BIN)/...` is the venv's own);
- `make test` runs the suite with the system's PATH only, so CI on any machine sees what a
  fresh machine sees (checked by the last test, under `make test`).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("meg", "storage", "engines", "tasks", "flows", "workloads", "bench", "tests")
# tools a user gets only from the project's virtualenv (or a global install of their own);
# library names that are also values (`vllm` is a backend) are left out
TOOLS = frozenset(
    {
        "python", "python3", "python3.11", "pip", "pip3", "flexmarl", "prefect", "dask",
        "dask-scheduler", "dask-worker", "mkdocs", "moto_server", "pytest", "ruff", "mypy",
        "uvicorn", "huggingface-cli",
    }
)  # fmt: skip
# tools whose names are also tracker names (`run.tracking: [tensorboard, wandb, mlflow]`): a
# literal that starts with one is an argv only when a subcommand of the tool follows it
SUBCOMMANDS = {
    "mlflow": frozenset({"server", "ui", "run", "gc", "db", "artifacts"}),
    "tensorboard": frozenset({"--logdir", "--logdir_spec", "dev"}),
    "wandb": frozenset({"sync", "login", "offline", "online", "server", "artifact"}),
}
# the PATH `make test` gives the suite: the system's directories only
FRESH_PATH = "/usr/bin:/bin"


def bare_commands(source: str) -> list[tuple[int, str]]:
    """(line, tool) for every list or tuple literal whose first item is a tool's bare name:
    the shape of an argv handed to subprocess, a namespace host or a Popen wrapper."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first, second = node.elts[0], node.elts[1] if len(node.elts) > 1 else None
            if not isinstance(first, ast.Constant):
                continue
            if first.value in TOOLS or (
                isinstance(second, ast.Constant)
                and second.value in SUBCOMMANDS.get(str(first.value), ())
            ):
                found.append((node.lineno, str(first.value)))
    return found


def bare_recipe_calls(makefile: str) -> list[tuple[int, str]]:
    """(line, tool) for every recipe command (a tab-indented Makefile line, or a line of a
    shell script) that starts a tool by bare name; `$(BIN)/tool` is the venv's own."""
    found = []
    for n, line in enumerate(makefile.splitlines(), 1):
        for command in re.split(r"&&|\|\||;|\|", line.lstrip("\t@ ")):
            words = command.split()
            while words and "=" in words[0]:  # VAR=value tool ...
                words.pop(0)
            if words and words[0] in {"env", "exec"}:
                words = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
            if words and (words[0] in TOOLS or words[0] in SUBCOMMANDS):
                found.append((n, words[0]))
    return found


def python_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_the_checks_catch_a_bare_tool_and_pass_the_interpreter() -> None:
    bad = (
        'subprocess.run(["prefect", "server", "start"])\nhost.start(("dask", "scheduler"))\n'
        'Popen(["mlflow", "server", "--port", "5000"])\n'
    )
    good = (
        'subprocess.run([sys.executable, "-m", "prefect", "server", "start"])\nx = ["a"]\n'
        'tracking(("mlflow",), run_dir)\nrun = {"tracking": ["tensorboard", "wandb", "mlflow"]}\n'
    )
    assert bare_commands(bad) == [(1, "prefect"), (2, "dask"), (3, "mlflow")]
    assert bare_commands(good) == []
    assert bare_recipe_calls("test:\n\tmkdocs build\n\t@cd x && flexmarl train\n\tmlflow ui\n") == [
        (2, "mkdocs"),
        (3, "flexmarl"),
        (4, "mlflow"),
    ]
    assert bare_recipe_calls("\tNO_X=1 env PATH=/bin pytest -q\n") == [(1, "pytest")]
    assert bare_recipe_calls("\t$(BIN)/python -m mkdocs build\n\tpython3.11 -m venv x\n") == [
        (2, "python3.11")
    ]


def test_no_module_starts_a_tool_by_bare_name() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {tool}"
        for path in python_files()
        if path.name != Path(__file__).name  # this file names the tools it looks for
        for line, tool in bare_commands(path.read_text())
    ]
    assert not offenders, "start these from sys.executable (-m ...):\n" + "\n".join(offenders)


def test_no_recipe_starts_a_tool_by_bare_name() -> None:
    """The Makefile creates the venv with `$(PY)` (the one prerequisite a user brings, found
    on their PATH); every other tool comes from `$(BIN)`."""
    offenders = [
        f"{name}:{line}: {tool}"
        for name in ("Makefile", ".ci/run")
        for line, tool in bare_recipe_calls((ROOT / name).read_text())
    ]
    assert not offenders, "name the venv's tool ($(BIN)/...):\n" + "\n".join(offenders)


def test_make_test_runs_the_suite_with_a_fresh_machine_path() -> None:
    """The Makefile's test recipe sets the PATH a fresh machine has; under `make test` (which
    exports FLEXMARL_SUITE_PATH) that PATH is this process's, and no project tool is on it."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert f"FRESH_PATH := {FRESH_PATH}" in makefile
    assert re.search(r"^SUITE_ENV := env .*PATH=\$\(FRESH_PATH\)", makefile, re.M), makefile
    assert "$(SUITE_ENV) $(BIN)/python -m pytest" in recipe, recipe
    assert "$(SUITE_ENV) $(BIN)/python -m mkdocs build --strict" in recipe, recipe
    if "FLEXMARL_SUITE_PATH" not in os.environ:
        pytest.skip("run outside `make test`: this process's PATH is the caller's")
    assert os.environ["PATH"] == FRESH_PATH
    for tool in ("prefect", "dask", "flexmarl", "mkdocs", "moto_server"):
        assert shutil.which(tool) is None, f"{tool} is on the suite's PATH: {shutil.which(tool)}"
