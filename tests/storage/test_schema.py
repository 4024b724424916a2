from __future__ import annotations

import numpy as np
import pytest

from storage.schema import SampleBatch, SegmentKey
from storage.testing import synthetic_batch


def test_segment_key_id_is_sortable_and_parses() -> None:
    keys = [SegmentKey(10, 0, "a"), SegmentKey(2, 11, "b"), SegmentKey(2, 3, "debate_a@1")]
    ids = sorted(k.id for k in keys)
    assert ids == ["k000002-m0003-debate_a@1", "k000002-m0011-b", "k000010-m0000-a"]
    assert [SegmentKey.parse(i) for i in ids] == sorted(keys, key=lambda k: k.id)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 0, "a"), "step"),
        ((0, -2, "a"), "micro_batch"),
        ((0, 0, "a/b"), "node"),
        ((0, 0, ""), "node"),
    ],
)
def test_segment_key_validation(args: tuple[int, int, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SegmentKey(*args)


def test_slicing_take_concat() -> None:
    a = synthetic_batch(SegmentKey(0, 0, "s"), seed=1)
    b = synthetic_batch(SegmentKey(0, 1, "s"), seed=2)
    ab = SampleBatch.concat([a, b])
    assert len(ab) == 16
    np.testing.assert_array_equal(ab.response(9), b.response(1))
    np.testing.assert_array_equal(ab.logprob(9), b.logprob(1))
    np.testing.assert_array_equal(ab.prompt(0), a.prompt(0))
    t = ab.take([9, 0])
    np.testing.assert_array_equal(t.response(0), b.response(1))
    np.testing.assert_array_equal(t.prompt(1), a.prompt(0))
    assert len(ab.take(np.zeros(16, bool))) == 0
    assert list(ab.response_lengths[:8]) == list(a.response_lengths)


def test_from_rows_defaults() -> None:
    rows = [
        dict(
            sample_id="e/n/0/0",
            group_id="e/n/0",
            node="n",
            episode="e",
            step=0,
            policy_version=0,
            prompt_ids=[1, 2],
            response_ids=[3],
            logprobs=[-0.1],
            parent_ids=["p/a", "p/b"],
        ),
    ]
    b = SampleBatch.from_rows(rows)
    assert b.parent_ids[0] == "p/a,p/b" and np.isnan(b.reward[0]) and b.finish_reason[0] == "stop"
    with pytest.raises(ValueError, match="missing field 'node'"):
        SampleBatch.from_rows([{k: v for k, v in rows[0].items() if k != "node"}])


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"logprobs": np.zeros(3, np.float32)}, "logprobs must have one value per response token"),
        ({"response_offsets": np.zeros(3, np.int64)}, "response_offsets must have N\\+1"),
        ({"step": np.zeros(2, np.int64)}, "column step must have shape"),
        ({"sample_id": np.array(["x"] * 8)}, "sample_id must be unique"),
    ],
)
def test_validation_names_the_broken_invariant(change: dict, match: str) -> None:
    b = synthetic_batch(SegmentKey(0, 0, "s"))
    with pytest.raises(ValueError, match=match):
        b.replace(**change)


def test_offsets_must_be_monotonic() -> None:
    b = synthetic_batch(SegmentKey(0, 0, "s"), groups=1, group_size=3)
    off = b.prompt_offsets.copy()
    off[1], off[2] = off[2], off[1]
    with pytest.raises(ValueError, match="non-decreasing"):
        b.replace(prompt_offsets=off)
