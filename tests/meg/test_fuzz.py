"""Fuzzing `flexmarl meg validate` and `flexmarl train`'s checks (hypothesis, bounded and
derandomized for CI): arbitrary YAML documents, and arbitrary mutations of every built-in
MEG, never give a traceback — the file is accepted, or what is wrong is said in one line
(exit 2). A mutation the loader cannot handle shows up here as an exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli import main, user_error_types
from flows.train import TrainParams, check
from workloads import BUILTIN

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["", "solver", "per_sample", "april", "greso", "{question}", "-1", "1e9"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)


def validate(doc: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`meg validate` on `doc` written as YAML: exit 0, or exit 2 with one error line; and
    `flexmarl train`'s checks before anything starts (`flows.train.check`): pass, or raise a
    user error (what the CLI prints in one line with exit 2), never anything else."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meg.yaml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
        capsys.readouterr()
        code = main(["meg", "validate", str(path)])
        out = capsys.readouterr()
        assert code in (0, 2), (code, out.err)
        if code == 2:
            assert out.err.startswith("flexmarl: error: ") and "Traceback" not in out.err
        try:
            check(TrainParams(config=str(path), run_dir=str(Path(tmp) / "run")))
        except user_error_types():
            pass


@FUZZ
@given(doc=VALUES)
def test_any_yaml_document_is_accepted_or_refused_in_one_line(
    doc: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    validate(doc, capsys)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a nested document (lists by index)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_builtin(draw: st.DrawFn) -> Any:
    """A built-in MEG with one to three of: a value replaced, a key deleted, a key added."""
    name = draw(st.sampled_from(sorted(BUILTIN)))
    doc = yaml.safe_load(BUILTIN[name].read_text())
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["replace", "delete", "add"]))
        if not path:  # the document itself
            doc = draw(VALUES) if kind == "replace" else doc
            continue
        *parent_path, last = path
        parent = doc
        for k in parent_path:
            parent = parent[k]
        if kind == "replace":
            parent[last] = draw(VALUES)
        elif kind == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.text(max_size=8))] = draw(VALUES)
    return doc


@FUZZ
@given(doc=mutated_builtin())
def test_mutations_of_the_builtin_megs_are_accepted_or_refused_in_one_line(
    doc: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    validate(doc, capsys)
