"""Fuzzing a committed segment's bytes (hypothesis, bounded and derandomized for CI): any
corruption of any one of its files — bytes flipped, the file cut short, garbage appended —
either leaves the segment readable with exactly its data (a harmless edit, such as trailing
bytes after a JSON document) or fails the read with a `StoreError` that names the segment's
path. Nothing else changes: the other segment still reads the same, and no file is written."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.errors import StoreError
from storage.schema import SampleBatch, SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch

KEYS = (SegmentKey(0, 0, "solve"), SegmentKey(0, 1, "solve"))


def _pristine() -> Path:
    """One store with two committed segments, built once and copied per example."""
    root = Path(tempfile.mkdtemp(prefix="flexmarl-fuzz-store-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # built at import: no fixture
    table = MEGStore.open(str(root), "run").table("solver")
    for key in KEYS:
        table.write_segment(key, synthetic_batch(key))
    return root


PRISTINE = _pristine()
VICTIM = KEYS[0].id  # the segment whose files are corrupted
CLEAN = {  # each segment as an undamaged store reads it back
    k.id: MEGStore.open(str(PRISTINE), "run").table("solver").read(segments=[k.id]) for k in KEYS
}
FILES = sorted(
    str(p.relative_to(PRISTINE))
    for p in (
        *(PRISTINE / "run/solver/segments" / VICTIM).rglob("*"),
        PRISTINE / "run/solver/commits" / f"{VICTIM}.json",
    )
    if p.is_file()
)


def _same(a: SampleBatch, b: SampleBatch) -> bool:
    ca, cb = a.columns(), b.columns()
    return ca.keys() == cb.keys() and all(
        np.array_equal(ca[k], cb[k], equal_nan=ca[k].dtype.kind == "f") for k in ca
    )


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@st.composite
def corruption(draw: st.DrawFn) -> tuple[str, bytes]:
    """(a file of the victim segment, its corrupted bytes)."""
    name = draw(st.sampled_from(FILES))
    raw = bytearray((PRISTINE / name).read_bytes())
    kind = draw(st.sampled_from(["flip", "truncate", "append", "replace"]))
    if kind == "flip" and raw:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif kind == "append":
        raw += draw(st.binary(min_size=1, max_size=64))
    else:
        raw = bytearray(draw(st.binary(max_size=256)))
    return name, bytes(raw)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(damage=corruption())
def test_a_corrupt_segment_is_refused_naming_its_path_and_nothing_else_changes(
    damage: tuple[str, bytes],
) -> None:
    name, raw = damage
    root = Path(tempfile.mkdtemp(prefix="flexmarl-fuzz-"))
    try:
        shutil.copytree(PRISTINE, root, dirs_exist_ok=True)
        (root / name).write_bytes(raw)
        before = _tree(root)
        table = MEGStore.open(str(root), "run").table("solver")
        try:
            batch = table.read(segments=[VICTIM])
        except StoreError as e:
            assert VICTIM in str(e), str(e)  # the message names the segment (its path)
        else:  # a harmless edit: then the data must be exactly what was committed
            assert _same(batch, CLEAN[VICTIM])
        assert _same(table.read(segments=[KEYS[1].id]), CLEAN[KEYS[1].id])
        assert _tree(root) == before, "reading a corrupt store changed files"
    finally:
        shutil.rmtree(root, ignore_errors=True)
