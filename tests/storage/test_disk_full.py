"""A full disk under a real (small) tmpfs: segment and checkpoint writes fail clearly, commit
nothing, leave the committed data byte-identical, and succeed once space is freed.

The tmpfs is mounted by the fixture (root or CAP_SYS_ADMIN needed, else the tests skip
saying so). tmpfs charges file data by 4 KiB page and nothing for directories, so a test can
leave exactly the pages it wants free."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.training.checkpoint import load_checkpoint, save_state
from engines.training.checkpoint_files import CheckpointError
from engines.training.checkpoint_index import latest_checkpoint
from storage import segments as seg
from storage.errors import StoreFullError
from storage.schema import SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch

PAGE = 4096
DISK = "4m"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own, unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(disk: Path, leave_pages: int = 0) -> Path:
    """Fill `disk` to the last page, then give `leave_pages` pages back; the filler file."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 * PAGE))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    size = filler.stat().st_size // PAGE * PAGE  # whole pages written
    os.truncate(filler, size - leave_pages * PAGE)
    return filler


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


BIG = {"groups": 4, "group_size": 4, "prompt_len": 2000, "response_len": 8000}  # ~600 kB


def committed_store(disk: Path) -> tuple[MEGStore, dict[str, str]]:
    """A store on `disk` with one committed segment; the bytes of its table."""
    store = MEGStore.open(str(disk / "store"), "run")
    key = SegmentKey(0, 0, "solve")
    store.table("solver").write_segment(key, synthetic_batch(key))
    return store, tree(disk / "store/run/solver/segments/k000000-m0000-solve")


def assert_unchanged(disk: Path, before: dict[str, str]) -> None:
    """The committed segment reads as written, from a fresh handle, with the same bytes."""
    assert tree(disk / "store/run/solver/segments/k000000-m0000-solve") == before
    fresh = MEGStore.open(str(disk / "store"), "run", create=False).table("solver")
    key = SegmentKey(0, 0, "solve")
    assert [i.segment_id for i in fresh.segments(step=0)] == [key.id]
    rows = fresh.read(step=0).response_ids
    np.testing.assert_array_equal(rows, synthetic_batch(key).response_ids)


def test_segment_data_on_a_full_disk(disk: Path) -> None:
    store, before = committed_store(disk)
    table = store.table("solver")
    key = SegmentKey(1, 0, "solve")
    batch = synthetic_batch(key, **BIG)
    files = seg.encode(batch.columns(), "rows", {"segment_id": key.id, "attempt": "x"})
    meta_files = sum(name.endswith("zarr.json") for name in files)
    filler = fill(disk, leave_pages=meta_files + 2)  # metadata and small chunks, not tokens
    with pytest.raises(StoreFullError, match=r"no space left writing .*k000001-m0000-solve") as e:
        table.write_segment(key, batch)
    assert e.value.errno == errno.ENOSPC and "ENOSPC" in str(e.value) and "resume" in str(e.value)
    attempt = disk / "store/run/solver/segments/k000001-m0000-solve"
    assert e.value.path.startswith(f"{attempt}/") and "/c/" in e.value.path  # a chunk:
    # the metadata files before it were written, then removed with the attempt folder
    assert table.has_segment(key) is None  # no marker: nothing visible
    assert not (disk / "store/run/solver/commits/k000001-m0000-solve.json").exists()
    assert files_under(disk / "store/run/solver/segments/k000001-m0000-solve") == []  # cleaned
    assert_unchanged(disk, before)

    filler.unlink()  # the operator frees space; the run resumes with the same write
    ref = table.write_segment(key, batch)
    assert ref.rows == len(batch)
    np.testing.assert_array_equal(table.read(step=1).response_ids, batch.response_ids)
    assert_unchanged(disk, before)


def test_commit_marker_on_a_full_disk(disk: Path) -> None:
    """The data fits exactly and the marker does not: still nothing visible, space given
    back, no temp file left beside the markers."""
    store, before = committed_store(disk)
    table = store.table("solver")
    key = SegmentKey(1, 0, "solve")
    batch = synthetic_batch(key, **BIG)
    files = seg.encode(batch.columns(), "rows", {"segment_id": key.id, "attempt": "x"})
    pages = sum(-(-v.nbytes // PAGE) for v in files.values())  # the attempt's own files
    filler = fill(disk, leave_pages=pages)
    with pytest.raises(StoreFullError, match=r"no space left writing .*commits/k000001-m0000"):
        table.write_segment(key, batch)
    commits = disk / "store/run/solver/commits"
    assert sorted(p.name for p in commits.iterdir()) == ["k000000-m0000-solve.json"]  # no .partial
    assert files_under(disk / "store/run/solver/segments/k000001-m0000-solve") == []
    assert_unchanged(disk, before)
    filler.unlink()
    table.write_segment(key, batch)
    assert [i.segment_id for i in table.segments()] == ["k000000-m0000-solve", key.id]


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"model/w": torch.randn(256, 512, generator=g), "optim/m": torch.zeros(1000)}


def test_checkpoint_on_a_full_disk_leaves_the_previous_one_latest(disk: Path) -> None:
    root = disk / "ckpt"
    save_state(f"{root}/v000001", tensors(1), {"version": 1})
    filler = fill(disk, leave_pages=16)  # less than the 512 kB state
    with pytest.raises(CheckpointError, match=r"no space left writing checkpoint .*v000002") as e:
        save_state(f"{root}/v000002", tensors(2), {"version": 2})
    assert e.value.errno == errno.ENOSPC and "previous checkpoint stays the latest" in str(e.value)
    assert sorted(p.name for p in root.iterdir()) == ["v000001"]  # no partial folder left
    assert latest_checkpoint(str(root)) == f"{root}/v000001"
    got, meta = load_checkpoint(f"{root}/v000001")
    assert meta == {"version": 1} and torch.equal(got["model/w"], tensors(1)["model/w"])

    filler.unlink()
    save_state(f"{root}/v000002", tensors(2), {"version": 2})
    assert latest_checkpoint(str(root)) == f"{root}/v000002"
    assert torch.equal(load_checkpoint(f"{root}/v000002")[0]["model/w"], tensors(2)["model/w"])
