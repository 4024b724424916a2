"""One conformance suite, run by every backend (file://, memory://, s3:// on moto)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from storage.errors import StoreError
from storage.schema import SampleBatch, SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch

Url = tuple[str, dict[str, Any] | None]


def _open(store_url: Url, run: str = "run1", **kw: Any) -> MEGStore:
    url, opts = store_url
    return MEGStore.open(url, run, storage_options=opts, **kw)


def _same(a: SampleBatch, b: SampleBatch) -> None:
    for name, col in a.columns().items():
        np.testing.assert_array_equal(col, getattr(b, name), err_msg=name)
        assert col.dtype.kind == getattr(b, name).dtype.kind, name
        assert col.dtype.kind == "U" or col.dtype == getattr(b, name).dtype, name


class TestStoreConformance:
    def test_round_trip_is_exact(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        key = SegmentKey(3, 1, "solve")
        batch = synthetic_batch(key, version=3)
        ref = table.write_segment(key, batch)
        assert (ref.segment_id, ref.rows, ref.versions, ref.kind) == (
            "k000003-m0001-solve",
            8,
            (3,),
            "rows",
        )
        _same(table.read(step=3), batch)
        assert pickle.loads(pickle.dumps(ref)) == ref

    def test_has_segment_is_one_marker_read(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        key = SegmentKey(2, 0, "solve")
        assert table.has_segment(key) is None
        ref = table.write_segment(key, synthetic_batch(key))
        fresh = _open(store_url, create=False).table("solver")  # no cache: reads the marker
        info = fresh.has_segment(key)
        assert info is not None and (info.segment_id, info.rows, info.kind) == (
            ref.segment_id,
            8,
            "rows",
        )
        assert fresh.has_segment(key, kind="scores") is None
        assert fresh.has_segment(SegmentKey(2, 1, "solve")) is None
        fresh.write_scores(key, ["x"], [1.0], [0.0])
        assert fresh.has_segment(key, kind="scores") is not None
        with pytest.raises(StoreError, match="'rows', 'scores' or 'carry', got 'row'"):
            fresh.has_segment(key, kind="row")

    def test_empty_segment(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        key = SegmentKey(0, 0, "solve")
        ref = table.write_segment(key, SampleBatch.empty())
        assert ref.rows == 0 and len(table.read(segments=[ref])) == 0

    def test_retry_yields_one_visible_copy_first_wins(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        key = SegmentKey(0, 0, "solve")
        first = synthetic_batch(key, seed=1)
        ref1 = table.write_segment(key, first)
        ref2 = table.write_segment(key, synthetic_batch(key, seed=2))  # a retried task
        fresh = _open(store_url, create=False).table("solver")  # no cache
        assert ref1 == ref2 and len(fresh.segments()) == 1
        _same(fresh.read(), first)

    def test_filters(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        for step in range(2):
            for mb in range(2):
                for node in ("solve", "verify"):
                    k = SegmentKey(step, mb, node)
                    table.write_segment(k, synthetic_batch(k, version=step, seed=step * 10 + mb))
        assert len(table.segments()) == 8
        assert [s.segment_id for s in table.segments(step=1, node="verify")] == [
            "k000001-m0000-verify",
            "k000001-m0001-verify",
        ]
        assert len(table.segments(micro_batch=1)) == 4
        got = table.read(step=1, node="solve", micro_batch=0)
        assert set(got.node) == {"solve"} and set(got.step) == {1} and len(got) == 8
        assert set(table.read(min_version=1).policy_version) == {1}
        assert set(table.read(max_version=0).policy_version) == {0}
        assert len(table.read(min_version=2)) == 0

    def test_scores_join_and_unscored_stay_nan(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        k0, k1 = SegmentKey(0, 0, "solve"), SegmentKey(0, 1, "solve")
        b0 = synthetic_batch(k0)
        table.write_segment(k0, b0)
        table.write_segment(k1, synthetic_batch(k1))
        table.write_scores(
            SegmentKey(0, 0, "score"), b0.sample_id[::-1], np.arange(8.0), -np.arange(8.0)
        )
        got = table.read(step=0)
        np.testing.assert_array_equal(got.reward[:8], np.arange(8.0)[::-1])
        np.testing.assert_array_equal(got.advantage[:8], -np.arange(8.0)[::-1])
        assert np.isnan(got.reward[8:]).all()
        assert [s.kind for s in table.segments(kind="scores")] == ["scores"]

    def test_a_read_of_named_segments_parses_only_its_steps_names(
        self, store_url: Url, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A trainer reads its step's segments by id; finding their scores parses the names
        of that step only, so a read does not cost more the longer the run (before, each
        read parsed every name of the table: 240,800 for a 100-step run's audit)."""
        import storage.table as table_mod

        table = _open(store_url).table("solver")
        for k in range(12):
            key = SegmentKey(k, 0, "solve")
            b = synthetic_batch(key)
            table.write_segment(key, b)
            table.write_scores(SegmentKey(k, 0, "score"), b.sample_id, np.full(8, k), np.zeros(8))
        parsed: list[str] = []
        real = table_mod.parse_segment_id

        def counting(sid: str) -> Any:
            parsed.append(sid)
            return real(sid)

        monkeypatch.setattr(table_mod, "parse_segment_id", counting)
        got = table.read(segments=["k000007-m0000-solve"])
        assert set(got.reward.tolist()) == {7.0} and len(got) == 8
        assert parsed and all(sid.startswith("k000007-") for sid in parsed)

    def test_conflicting_scores_are_an_error(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        k = SegmentKey(0, 0, "solve")
        b = synthetic_batch(k)
        table.write_segment(k, b)
        table.write_scores(SegmentKey(0, 0, "score_a"), b.sample_id, np.zeros(8), np.zeros(8))
        table.write_scores(SegmentKey(0, 0, "score_b"), b.sample_id, np.ones(8), np.zeros(8))
        with pytest.raises(StoreError, match="different scores"):
            table.read()

    def test_consumption_log(self, store_url: Url) -> None:
        table = _open(store_url).table("solver")
        k = SegmentKey(2, 0, "solve")
        ref = table.write_segment(k, synthetic_batch(k))
        assert table.consumption(2) is None
        table.record_consumption(2, [ref.segment_id], [2], {"trainer": "t0"})
        table.record_consumption(2, [ref.segment_id], [2])  # a retried step: no-op
        rec = table.consumption(2)
        assert rec is not None and rec["segments"] == [ref.segment_id] and rec["versions"] == [2]
        assert list(table.consumption_log()) == [2]
        with pytest.raises(StoreError, match="already recorded"):
            table.record_consumption(2, [ref.segment_id], [1])
        with pytest.raises(StoreError, match="missing"):
            table.record_consumption(3, ["k000003-m0000-solve"], [3])

    def test_listing_runs_and_agents(self, store_url: Url) -> None:
        url, opts = store_url
        a, b = _open(store_url, "run-a"), _open(store_url, "run-b")
        a.table("solver")
        a.table("verifier")
        assert MEGStore.runs(url, opts) == ["run-a", "run-b"]
        assert a.agents() == ["solver", "verifier"] and b.agents() == []

    def test_missing_store_and_segment(self, store_url: Url) -> None:
        with pytest.raises(StoreError, match="no MEG store"):
            _open(store_url, "nope", create=False)
        table = _open(store_url).table("solver")
        with pytest.raises(StoreError, match=r"k000009-m0000-solve.*missing"):
            table.read(segments=["k000009-m0000-solve"])

    def test_blobs(self, store_url: Url) -> None:
        store = _open(store_url)
        ref = store.put_blob("a long prompt " * 100)
        assert ref.startswith("blob:") and store.get_blob(ref) == ("a long prompt " * 100).encode()
        with pytest.raises(StoreError, match="not found"):
            store.get_blob("blob:" + "0" * 64)

    def test_store_handle_pickles(self, store_url: Url) -> None:
        store = _open(store_url)
        k = SegmentKey(0, 0, "solve")
        store.table("solver").write_segment(k, synthetic_batch(k))
        again = pickle.loads(pickle.dumps(store))
        assert len(again.table("solver").read()) == 8


def test_bad_names_are_rejected(tmp_path: Any) -> None:
    with pytest.raises(StoreError, match="run id"):
        MEGStore.open(str(tmp_path), "../escape")
    store = MEGStore.open(str(tmp_path), "r")
    with pytest.raises(StoreError, match="agent"):
        store.table("a/b")
    table = store.table("solver")
    k = SegmentKey(0, 0, "solve")
    with pytest.raises(StoreError, match="step=0 and node='solve'"):
        table.write_segment(k, synthetic_batch(SegmentKey(0, 0, "other")))
    with pytest.raises(StoreError, match="same length"):
        table.write_scores(k, ["a", "b"], [1.0], [1.0, 2.0])
