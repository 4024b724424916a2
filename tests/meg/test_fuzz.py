"""Fuzzing `flexmarl meg validate` and `flexmarl train`'s checks (hypothesis, bounded and
derandomized for CI): arbitrary YAML documents, and arbitrary mutations of every built-in
MEG, never give a traceback — the file is accepted, or what is wrong is said in one line
(exit 2). A mutation the loader cannot handle shows up here as an exception.

The built-ins' agents are pointed at a real tiny model first, so that a mutation is not
simply refused for its missing model and reaches every later check (sizes included)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli.main import main, user_error_types
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


TINY = "@TINY@"  # where a built-in names its model; the test puts a real one there


@pytest.fixture(scope="module")
def fuzz_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from workloads.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny", seed=0))


def with_model(doc: Any, model: str) -> Any:
    if isinstance(doc, dict):
        return {k: with_model(v, model) for k, v in doc.items()}
    if isinstance(doc, list):
        return [with_model(v, model) for v in doc]
    return model if doc == TINY else doc


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


SIZES = st.one_of(
    st.integers(-2, 4),
    st.integers(10**3, 10**12),
    st.sampled_from([2**31, 2**63, 10**100, 1e300, -1e-300]),
)


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated_builtin(draw: st.DrawFn) -> Any:
    """A built-in MEG with one to three of: a value replaced, a key deleted, a key added, a
    number resized."""
    name = draw(st.sampled_from(sorted(BUILTIN)))
    doc = yaml.safe_load(BUILTIN[name].read_text())
    for agent in doc["agents"].values():
        agent["model"] = TINY
        agent.pop("tokenizer", None)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["replace", "delete", "add", "resize"]))
        if not path:  # the document itself
            doc = draw(VALUES) if kind == "replace" else doc
            continue
        *parent_path, last = path
        parent = doc
        for k in parent_path:
            parent = parent[k]
        if kind == "resize":  # a number of the document: tiny, negative or absurdly big
            sized = [q for q in paths if q and isinstance(_at(doc, q), int | float)]
            if sized:
                *parent_path, last = draw(st.sampled_from(sized))
                parent = _at(doc, tuple(parent_path))
                parent[last] = draw(SIZES)
        elif kind == "replace":
            parent[last] = draw(VALUES)
        elif kind == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.text(max_size=8))] = draw(VALUES)
    return doc


@FUZZ
@given(doc=mutated_builtin())
def test_mutations_of_the_builtin_megs_are_accepted_or_refused_in_one_line(
    doc: Any, capsys: pytest.CaptureFixture[str], fuzz_model: str
) -> None:
    validate(with_model(doc, fuzz_model), capsys)
