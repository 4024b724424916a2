"""Faults with real processes: concurrent writers, a SIGKILLed writer, damaged stores."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from storage.errors import IntegrityError, StoreError
from storage.schema import SCHEMA_VERSION, SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch
from tests.storage import _workers


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_eight_concurrent_writers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    url = str(tmp_path)
    MEGStore.open(url, "run").table("solver")
    workers, own, contended = 8, 25, 4
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_workers.write_many, url, w, own, contended) for w in range(workers)]
        written = [f.result(timeout=300) for f in futures]
    table = MEGStore.open(url, "run", create=False).table("solver")
    infos = table.segments()
    assert len(infos) == workers * own + contended
    assert sorted(i.segment_id for i in infos if i.step != 999) == sorted(
        s for w in written for s in w
    )
    rows = table.read()
    assert len(rows) == (workers * own + contended) * 8
    assert len(np.unique(rows.sample_id)) == len(rows)  # nothing duplicated
    # each contended key has exactly one visible copy, and losers left no attempt folders
    for j in range(contended):
        assert len(os.listdir(tmp_path / "run/solver/segments" / f"k000999-m{j:04d}-race")) == 1


def test_sigkilled_writer_is_invisible_and_retry_commits(tmp_path: Path) -> None:
    url = str(tmp_path)
    MEGStore.open(url, "run").table("solver")
    seg_dir = tmp_path / "run/solver/segments/k000000-m0000-solve"
    proc = mp.get_context("spawn").Process(target=_workers.write_huge, args=(url,))
    proc.start()
    deadline = time.monotonic() + 120
    while not (seg_dir.exists() and any(seg_dir.rglob("c/0"))):  # some columns written
        assert time.monotonic() < deadline and proc.is_alive(), "writer finished or never started"
        time.sleep(0.002)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    assert not (tmp_path / "run/solver/commits/k000000-m0000-solve.json").exists()
    table = MEGStore.open(url, "run", create=False).table("solver")
    assert table.segments() == [] and len(table.read()) == 0  # partial attempt is invisible
    key = SegmentKey(0, 0, "solve")
    batch = synthetic_batch(key)
    ref = table.write_segment(key, batch)
    assert ref.rows == 8 and len(os.listdir(seg_dir)) == 2  # dead attempt + committed retry
    np.testing.assert_array_equal(table.read().response_ids, batch.response_ids)


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, str]:
    table = MEGStore.open(str(tmp_path), "run").table("solver")
    key = SegmentKey(0, 0, "solve")
    ref = table.write_segment(key, synthetic_batch(key))
    return tmp_path, ref.segment_id


def _expect(root: Path, exc: type[Exception], match: str, fn: object) -> None:
    before = _tree(root)
    with pytest.raises(exc, match=match):
        fn()  # type: ignore[operator]
    assert _tree(root) == before, "a failing operation changed files"


def test_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mydata.csv").write_text("a,b\n")
    _expect(
        tmp_path,
        StoreError,
        f"{tmp_path}/run exists but is not a MEG store",
        lambda: MEGStore.open(str(tmp_path), "run"),
    )


@pytest.mark.parametrize("manifest", ["store.json", "solver/table.json"])
def test_unknown_schema_version(damaged: tuple[Path, str], manifest: str) -> None:
    root, _ = damaged
    path = root / "run" / manifest
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "schema_version": 99}))
    _expect(
        root,
        StoreError,
        f"{path} has schema_version 99",
        lambda: MEGStore.open(str(root), "run").table("solver"),
    )


def test_corrupt_marker(damaged: tuple[Path, str]) -> None:
    root, sid = damaged
    marker = root / "run/solver/commits" / f"{sid}.json"
    marker.write_bytes(b"\x00garbage")
    table = MEGStore.open(str(root), "run").table("solver")
    _expect(root, StoreError, f"corrupt commit marker at {marker}", table.read)
    marker.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "segment_id": sid}))
    _expect(root, StoreError, f"corrupt commit marker at {marker}", table.segments)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("kind", "sows", "its segment id says"),  # once read back as an empty segment
        ("step", 7, "its segment id says"),
        ("rows", -1, "is not a count"),
        ("versions", ["x"], "ValueError"),
        ("attempt", "../../elsewhere", "is not a folder name"),
    ],
)
def test_a_marker_field_that_contradicts_its_segment_is_corrupt(
    damaged: tuple[Path, str], field: str, value: object, says: str
) -> None:
    root, sid = damaged
    marker = root / "run/solver/commits" / f"{sid}.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), field: value}))
    table = MEGStore.open(str(root), "run").table("solver")
    _expect(root, StoreError, f"corrupt commit marker at {marker}: .*{says}", table.read)


def test_corrupt_chunk(damaged: tuple[Path, str]) -> None:
    root, sid = damaged
    (chunk,) = (root / "run/solver/segments" / sid).glob("*/response_ids/c/0")
    raw = bytearray(chunk.read_bytes())
    raw[10] ^= 0xFF  # a same-length flip: caught by the CRC32C codec
    chunk.write_bytes(bytes(raw))
    table = MEGStore.open(str(root), "run").table("solver")
    _expect(root, IntegrityError, f"segment {chunk.parents[2]} cannot be read", table.read)


def test_missing_segment_data_and_unknown_segment(damaged: tuple[Path, str]) -> None:
    root, sid = damaged
    (attempt,) = (root / "run/solver/segments" / sid).iterdir()
    for p in sorted(attempt.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    attempt.rmdir()
    table = MEGStore.open(str(root), "run").table("solver")
    _expect(root, IntegrityError, str(attempt), table.read)
    _expect(
        root,
        StoreError,
        "k000005-m0000-solve .*missing",
        lambda: table.read(segments=["k000005-m0000-solve"]),
    )


def test_memory_store_refuses_other_processes() -> None:
    store = MEGStore.open("memory://per-process-test", "run")
    key = SegmentKey(0, 0, "solve")
    ref = store.table("solver").write_segment(key, synthetic_batch(key))
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        with pytest.raises(StoreError, match="memory:// store, which lives in one process"):
            pool.submit(_workers.read_ref, store, ref).result(timeout=120)
        with pytest.raises(StoreError, match="memory:// stores are per-process"):
            pool.submit(_workers.open_memory, "memory://per-process-test").result(timeout=120)
