from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from storage.cursor import Cursor
from storage.errors import StoreError
from storage.schema import SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch


def test_cursor_hands_out_ready_scored_microbatches(tmp_path: Path) -> None:
    table = MEGStore.open(str(tmp_path), "r").table("solver")
    cur = Cursor(table, step=1, micro_batches=2, nodes=["solve", "revise"])
    assert cur.poll() is None
    k1 = SegmentKey(1, 1, "solve")
    b1 = synthetic_batch(k1, version=1)
    table.write_segment(k1, b1)
    table.write_scores(SegmentKey(1, 1, "score"), b1.sample_id, np.ones(8), np.zeros(8))
    assert cur.poll() is None  # node "revise" of micro-batch 1 is not written yet
    k2 = SegmentKey(1, 1, "revise")
    b2 = synthetic_batch(k2, version=1)
    table.write_segment(k2, b2)
    assert cur.poll() is None  # its rows are not scored yet
    table.write_scores(SegmentKey(1, 1, "score2"), b2.sample_id, np.ones(8), np.zeros(8))
    mb = cur.next(timeout=5)
    assert mb is not None and mb.micro_batch == 1 and len(mb.batch) == 16 and mb.versions == (1,)
    assert set(mb.segment_ids) == {k1.id, k2.id}
    # groups are whole: every group id has all 4 of its samples
    _, counts = np.unique(mb.batch.group_id, return_counts=True)
    assert set(counts) == {4}
    assert cur.next(timeout=0.1) is None and not cur.done
    k0 = SegmentKey(1, 0, "solve")
    k0r = SegmentKey(1, 0, "revise")
    both = [synthetic_batch(k0, version=1), synthetic_batch(k0r, version=1)]
    for k, b in zip((k0, k0r), both, strict=True):
        table.write_segment(k, b)
        table.write_scores(SegmentKey(1, 0, f"s{k.node}"), b.sample_id, np.ones(8), np.ones(8))
    assert cur.next(timeout=5) is not None and cur.done and cur.next() is None
    cur.record({"slot": 0})
    rec = table.consumption(1)
    assert rec is not None and len(rec["segments"]) == 4 and rec["versions"] == [1]


def test_cursor_without_scores_and_bad_args(tmp_path: Path) -> None:
    table = MEGStore.open(str(tmp_path), "r").table("solver")
    k = SegmentKey(0, 0, "solve")
    table.write_segment(k, synthetic_batch(k))
    mb = Cursor(table, 0, 1, require_scores=False).poll()
    assert mb is not None and np.isnan(mb.batch.reward).all()
    with pytest.raises(StoreError, match="micro_batches"):
        Cursor(table, 0, 0)
