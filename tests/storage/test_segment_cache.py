"""A committed segment read a second time in one process comes from the segment cache:
the same rows and scores as a read from storage, fresh arrays each time, nothing decoded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from storage import segments as seg
from storage import table as table_mod
from storage.schema import SampleBatch, SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch

KEYS = [SegmentKey(1, 0, "solve"), SegmentKey(1, 1, "solve")]


def same(a: SampleBatch, b: SampleBatch) -> bool:
    ca, cb = a.columns(), b.columns()
    return ca.keys() == cb.keys() and all(
        ca[k].dtype == cb[k].dtype
        and np.array_equal(ca[k], cb[k], equal_nan=ca[k].dtype.kind == "f")
        for k in ca
    )


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(kind, segments) of every decode from storage."""
    calls: list[tuple[str, int]] = []
    real = seg.read_many

    def counting(jobs: list[Any], kind: str) -> list[Any]:
        calls.append((kind, len(jobs)))
        return real(jobs, kind)

    monkeypatch.setattr(seg, "read_many", counting)
    monkeypatch.setattr(table_mod, "_SEGMENTS", type(table_mod._SEGMENTS)())
    return calls


def scored_table(root: Path) -> Any:
    t = MEGStore.open(str(root), "run").table("solver")
    for k in KEYS:
        b = synthetic_batch(k, groups=2, group_size=3, seed=k.micro_batch)
        t.write_segment(k, b)
        t.write_scores(k, b.sample_id, np.arange(len(b)), np.ones(len(b)))
    return t


def test_a_second_read_decodes_nothing_and_returns_the_same_rows_and_scores(
    tmp_path: Path, decoded: list[tuple[str, int]]
) -> None:
    t = scored_table(tmp_path / "s")
    first = t.read(step=1)
    assert decoded == [("rows", 2), ("scores", 2)]
    again = t.read(step=1)
    assert decoded == [("rows", 2), ("scores", 2)]  # all from the cache
    assert same(first, again)
    # what a process that never read it gets from storage: a fresh table, cache off
    fresh = MEGStore.open(str(tmp_path / "s"), "run").table("solver")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(table_mod, "SEGMENT_CACHE_BYTES", 0)
        assert same(fresh.read(step=1), again)
    # one cached segment and one not: only the other is decoded
    part = t.read(segments=[KEYS[0].id])
    assert same(part, first.take(np.arange(len(part))))  # rows in segment order


def test_callers_own_what_they_read(tmp_path: Path, decoded: list[tuple[str, int]]) -> None:
    t = scored_table(tmp_path / "s")
    a = t.read(step=1)
    a.reward[:] = -7.0  # a caller writing into its batch
    a.response_ids[:] = 0
    b = t.read(step=1)
    assert not np.any(b.reward == -7.0) and np.any(b.response_ids != 0)


def test_off_and_over_its_bound_it_reads_storage(
    tmp_path: Path, decoded: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = scored_table(tmp_path / "s")
    monkeypatch.setattr(table_mod, "SEGMENT_CACHE_BYTES", 0)
    t.read(step=1)
    t.read(step=1)
    assert decoded == [("rows", 2), ("scores", 2)] * 2
    one = t.read(segments=[KEYS[0].id]).nbytes
    monkeypatch.setattr(table_mod, "SEGMENT_CACHE_BYTES", one + 1)  # room for one rows segment
    decoded.clear()
    t.read(segments=[KEYS[0].id])
    t.read(segments=[KEYS[1].id])  # pushes the first out
    t.read(segments=[KEYS[0].id])
    assert [c for c in decoded if c[0] == "rows"] == [("rows", 1)] * 3
    assert sum(n for _, n in table_mod._SEGMENTS.values()) <= one + 1


def test_another_store_or_attempt_is_another_segment(
    tmp_path: Path, decoded: list[tuple[str, int]]
) -> None:
    a, b = scored_table(tmp_path / "a"), scored_table(tmp_path / "b")
    a.read(step=1)
    b.read(step=1)  # same run, agent and ids, other store: read from its own storage
    assert [c for c in decoded if c[0] == "rows"] == [("rows", 2), ("rows", 2)]
