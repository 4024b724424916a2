from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from storage.cli import store_ls, store_show
from storage.errors import StoreError
from storage.schema import SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch


def _fill(root: Path) -> None:
    table = MEGStore.open(str(root), "run1").table("solver")
    for step in (0, 1):
        k = SegmentKey(step, 0, "solve")
        b = synthetic_batch(k, version=step)
        table.write_segment(k, b)
        table.write_scores(SegmentKey(step, 0, "score"), b.sample_id, np.full(8, 0.5), np.zeros(8))
    table.record_consumption(0, ["k000000-m0000-solve"], [0])
    MEGStore.open(str(root), "run1").table("verifier")


def test_ls_and_show(tmp_path: Path) -> None:
    _fill(tmp_path)
    text = store_ls(str(tmp_path))
    assert "run1" in text and "solver" in text and "verifier" in text and "0..1" in text
    summary = json.loads(store_ls(str(tmp_path), as_json=True))
    assert (
        summary[0] | {"steps": [0, 1], "segments": 2, "rows": 16, "versions": [0, 1]} == summary[0]
    )
    rows = json.loads(store_show(str(tmp_path), "run1", "solver", step=1, as_json=True))
    assert len(rows) == 8 and {r["step"] for r in rows} == {1} and rows[0]["reward"] == 0.5
    assert {r["source"] for r in rows} == {"self"}  # every row sampled by the agent itself
    text = store_show(str(tmp_path), "run1", "solver")
    assert "16 rows" in text and "0.500" in text


def test_user_mistakes(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no MEG store runs"):
        store_ls(str(tmp_path))
    _fill(tmp_path)
    with pytest.raises(StoreError, match="no table 'critic'"):
        store_show(str(tmp_path), "run1", "critic")
    with pytest.raises(StoreError, match="no MEG store"):
        store_show(str(tmp_path), "run9", "solver")
