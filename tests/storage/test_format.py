"""The on-disk format (schema_version 3) as a user without FlexMARL sees it: plain zarr."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from storage.errors import IntegrityError
from storage.schema import SegmentKey
from storage.segments import ROWS_LAYOUT
from storage.store import MEGStore
from storage.testing import synthetic_batch


def _columns(g: Any) -> dict[str, np.ndarray]:
    """The plain-zarr reader of docs/store.md: every column of a segment group, by name."""
    out = {}
    for name, arr in g.arrays():
        cols = arr.attrs.get("columns")  # packed: row k of the array is column cols[k]
        values = arr[...]
        out.update({name: values} if cols is None else dict(zip(cols, values, strict=True)))
    return out


def test_segments_read_back_exactly_with_plain_zarr(tmp_path: Path) -> None:
    table = MEGStore.open(str(tmp_path), "run1").table("solver")
    key = SegmentKey(0, 2, "solve")
    batch = synthetic_batch(key, version=0)  # step 0, version 0: an all-zero int64 chunk
    table.write_segment(key, batch)
    table.write_scores(SegmentKey(0, 2, "score"), batch.sample_id[:3], [1, 2, 3], [0, 0, 0])
    found: dict[str, dict[str, Any]] = {}
    root = tmp_path / "run1" / "solver"
    for marker in sorted((root / "commits").glob("*.json")):
        m = json.loads(marker.read_text())
        folder = root / "segments" / m["segment_id"] / m["attempt"]
        found[m["kind"]] = _columns(zarr.open_group(str(folder), mode="r"))
        if m["kind"] == "rows":  # every chunk is a file, even one equal to the fill value
            assert (folder / "row_int64" / "c" / "0" / "0").is_file()
            assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == sorted(ROWS_LAYOUT)
    rows = found["rows"]
    stored = {k: v for k, v in batch.columns().items() if k != "score_status"}  # joined
    assert rows.keys() == stored.keys()
    for name, col in stored.items():
        got = rows[name]
        if col.dtype.kind == "U":
            assert got.tolist() == col.tolist(), name
        else:  # same dtype, bit-exact (NaN rewards included)
            assert got.dtype == col.dtype and got.tobytes() == col.tobytes(), name
    scores = found["scores"]
    assert scores["sample_id"].tolist() == batch.sample_id[:3].tolist()
    assert scores["reward"].tolist() == [1.0, 2.0, 3.0] and scores["reward"].dtype == np.float32
    assert scores["status"].tolist() == ["ok"] * 3


def test_score_status_is_joined_onto_rows(tmp_path: Path) -> None:
    table = MEGStore.open(str(tmp_path), "run1").table("solver")
    key = SegmentKey(0, 0, "solve")
    batch = synthetic_batch(key)
    table.write_segment(key, batch)
    assert table.read().score_status.tolist() == [""] * len(batch)  # not scored yet
    status = ["ok", "failed: TimeoutError: x", "dropped: a reward call of its group failed"]
    status += ["ok"] * (len(batch) - 3)
    nan = float("nan")
    table.write_scores(
        key, batch.sample_id, [1.0, nan] + [0.0] * (len(batch) - 2), [0.0] * len(batch), status
    )
    got = table.read()
    assert got.score_status.tolist() == status
    assert np.isnan(got.reward[1]) and got.reward[0] == 1.0
    assert got.take([2, 0]).score_status.tolist() == [status[2], status[0]]


def test_a_score_segment_without_status_reads_as_ok(tmp_path: Path) -> None:
    """Score segments written before the status column existed hold one string column."""
    table = MEGStore.open(str(tmp_path), "run1").table("solver")
    key = SegmentKey(0, 0, "solve")
    batch = synthetic_batch(key)
    table.write_segment(key, batch)
    table.write_scores(key, batch.sample_id, [1.0] * len(batch), [0.5] * len(batch))
    (folder,) = tmp_path.glob("run1/solver/segments/*.scores/*/strings")
    old = zarr.open_array(str(folder), mode="r")[...][:1]  # the sample_id row only
    arr = zarr.open_group(str(folder.parent), mode="a").create_array(
        "strings", shape=old.shape, dtype=old.dtype, overwrite=True
    )
    arr[...] = old
    arr.attrs["columns"] = ["sample_id"]
    got = MEGStore.open(str(tmp_path), "run1").table("solver").read()
    assert got.score_status.tolist() == ["ok"] * len(batch)
    assert got.advantage.tolist() == [0.5] * len(batch)


def test_a_rows_segment_without_source_reads_as_the_agent_s_own(tmp_path: Path) -> None:
    """Rows segments written before the source column existed hold six string columns: all
    of their rows were sampled by the table's own agent."""
    table = MEGStore.open(str(tmp_path), "run1").table("solver")
    key = SegmentKey(0, 0, "solve")
    batch = synthetic_batch(key)
    batch = batch.replace(source=np.array(["model:m"] + [""] * (len(batch) - 1)))
    table.write_segment(key, batch)
    other = MEGStore.open(str(tmp_path), "run1").table("critic")
    other.write_segment(key, batch)
    assert other.read().source.tolist() == batch.source.tolist()  # round trip
    (folder,) = [
        p for p in tmp_path.glob("run1/solver/segments/*/*/strings") if "scores" not in str(p)
    ]
    old = zarr.open_array(str(folder), mode="r")[...][:6]  # the columns before `source`
    arr = zarr.open_group(str(folder.parent), mode="a").create_array(
        "strings", shape=old.shape, dtype=old.dtype, overwrite=True
    )
    arr[...] = old
    arr.attrs["columns"] = list(ROWS_LAYOUT["strings"] or ())[:6]
    got = MEGStore.open(str(tmp_path), "run1").table("solver").read()
    assert got.source.tolist() == [""] * len(batch) and not got.external.any()
    assert got.sample_id.tolist() == batch.sample_id.tolist()


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize(
    "change, match",
    [
        ({"columns": ["policy_version", "step"]}, "array 'row_int64' has 2 dims and columns"),
        ({}, r"columns None; expected 2 dims and columns \('step', 'policy_version'\)"),
    ],
)
def test_a_damaged_layout_is_an_integrity_error(
    tmp_path: Path, change: dict[str, Any], match: str
) -> None:
    table = MEGStore.open(str(tmp_path), "run1").table("solver")
    key = SegmentKey(0, 0, "solve")
    table.write_segment(key, synthetic_batch(key))
    (meta,) = tmp_path.glob("run1/solver/segments/*/*/row_int64/zarr.json")
    doc = json.loads(meta.read_text())
    meta.write_text(json.dumps({**doc, "attributes": change}))  # columns swapped / dropped
    before = _tree(tmp_path)
    fresh = MEGStore.open(str(tmp_path), "run1", create=False).table("solver")
    with pytest.raises(IntegrityError, match=match):
        fresh.read()
    assert _tree(tmp_path) == before
