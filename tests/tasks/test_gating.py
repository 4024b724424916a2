"""Which invocations run (`tasks.gating`): skipped inputs, `when` conditions on the shown
samples' text and tool flags, and the rows a skipped invocation stores (never trained)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from meg.agentic_spec import WhenSpec
from meg.expand import InvocationPlan
from meg.samples import SampleInfo
from meg.spec import NodeSpec
from storage.schema import NOT_TRAINED, SKIPPED, TOOL, TOOL_STOP, SampleBatch
from tasks.gating import skipped, skipped_rows


def decode(node: str, ids: Sequence[int]) -> str:
    """Token ids are the characters' code points."""
    return "".join(chr(i) for i in ids)


def row(sid: str, text: str = "", finish: str = "stop", **kw: Any) -> dict[str, Any]:
    ids = [ord(c) for c in text]
    group, _, _ = sid.rpartition("/")
    return {
        "sample_id": sid,
        "group_id": group,
        "parent_ids": [],
        "node": sid.split("/")[1],
        "episode": sid.split("/")[0],
        "step": 0,
        "policy_version": 0,
        "prompt_ids": [1, 2, 3],
        "response_ids": ids,
        "logprobs": [-0.5] * len(ids),
        "finish_reason": finish,
        "gen_start": 0.0,
        "gen_end": 1.0,
        **kw,
    }


def batch(node: str, *rows: tuple[str, str]) -> SampleBatch:
    """Rows `e0/{node}/0/{i}` with (text, finish_reason)."""
    return SampleBatch.from_rows(
        [row(f"e0/{node}/0/{i}", text, finish) for i, (text, finish) in enumerate(rows)]
    )


def index_of(batches: dict[str, SampleBatch]) -> dict[str, int]:
    return {str(sid): i for b in batches.values() for i, sid in enumerate(b.sample_id)}


def info(node: str, i: int) -> SampleInfo:
    return SampleInfo(f"e0/{node}/0/{i}", node, ())


def plan(index: int, **shown: Sequence[int]) -> InvocationPlan:
    """An invocation of `act` that is shown samples `shown[parent]` of each parent."""
    inputs = tuple((p, tuple(info(p, i) for i in rows)) for p, rows in shown.items())
    return InvocationPlan("act", index, "e0", (), inputs)


def node(*when: WhenSpec, inputs: dict[str, str] | None = None) -> NodeSpec:
    inputs = inputs or {"judge": "per_sample"}
    template = " ".join(f"{{{p}}}" for p in inputs)
    return NodeSpec(agent="a", template=template, inputs=inputs, when=list(when))


YES = WhenSpec(node="judge", params={"text": "yes"})
NOT_YES = WhenSpec(node="judge", params={"text": "yes"}, negate=True)


def run(spec: NodeSpec, plans: list[InvocationPlan], **batches: SampleBatch) -> list[bool]:
    return skipped(spec, plans, batches, index_of(batches), decode)


# --- skipped inputs --------------------------------------------------------------------------


def test_a_skipped_input_skips_the_invocation_without_conditions() -> None:
    judge = batch("judge", ("yes", "stop"), ("", SKIPPED), ("no", "length"))
    plans = [plan(i, judge=[i]) for i in range(3)]
    assert run(node(), plans, judge=judge) == [False, True, False]


def test_one_skipped_sample_among_the_shown_skips() -> None:
    judge = batch("judge", ("a", "stop"), ("", SKIPPED))
    spec = node(inputs={"judge": "all"})
    assert run(spec, [plan(0, judge=[0, 1])], judge=judge) == [True]
    assert run(spec, [plan(0, judge=[0])], judge=judge) == [False]


def test_a_skipped_input_the_condition_does_not_read_still_skips() -> None:
    judge = batch("judge", ("yes", "stop"))
    code = batch("code", ("", SKIPPED), ("x=1", "stop"))
    spec = node(YES, inputs={"judge": "per_sample", "code": "first"})
    plans = [plan(0, judge=[0], code=[0]), plan(1, judge=[0], code=[1])]
    assert run(spec, plans, judge=judge, code=code) == [True, False]


def test_no_plans_no_answers() -> None:
    assert run(node(YES), [], judge=batch("judge")) == []


# --- conditions ------------------------------------------------------------------------------


def test_contains_runs_where_the_text_holds() -> None:
    judge = batch("judge", ("Yes, done", "stop"), ("no: retry", "stop"), ("YES", "length"))
    plans = [plan(i, judge=[i]) for i in range(3)]
    assert run(node(YES), plans, judge=judge) == [False, True, False]


def test_negate_runs_where_the_text_does_not_hold() -> None:
    judge = batch("judge", ("Yes, done", "stop"), ("no: retry", "stop"), ("YES", "length"))
    plans = [plan(i, judge=[i]) for i in range(3)]
    assert run(node(NOT_YES), plans, judge=judge) == [True, False, True]


def test_a_skipped_input_skips_even_where_the_condition_holds() -> None:
    judge = batch("judge", ("", SKIPPED))
    empty = WhenSpec(node="judge", fn="matches", params={"pattern": "^$"})  # holds on ""
    assert run(node(empty), [plan(0, judge=[0])], judge=judge) == [True]
    assert run(node(NOT_YES), [plan(0, judge=[0])], judge=judge) == [True]


def test_terminal_reads_the_tool_stop_flag() -> None:
    test = batch("test", (" 5/5 passed", TOOL_STOP), (" 2/5 passed", TOOL), ("", "stop"))
    plans = [plan(i, test=[i]) for i in range(3)]
    inputs = {"test": "per_sample"}
    done = WhenSpec(node="test", fn="terminal")
    assert run(node(done, inputs=inputs), plans, test=test) == [False, True, True]
    again = WhenSpec(node="test", fn="terminal", negate=True)
    assert run(node(again, inputs=inputs), plans, test=test) == [True, False, False]


def test_matches_reads_the_decoded_text() -> None:
    test = batch("test", (" 5/5 passed", TOOL), (" 0/5 passed; f(0) gave 4", TOOL))
    plans = [plan(i, test=[i]) for i in range(2)]
    failing = WhenSpec(node="test", fn="matches", params={"pattern": r"gave \d+"})
    assert run(node(failing, inputs={"test": "per_sample"}), plans, test=test) == [True, False]


def test_several_shown_samples_must_all_hold() -> None:
    judge = batch("judge", ("yes", "stop"), ("yes!", "stop"), ("no", "stop"))
    spec = node(YES, inputs={"judge": "all"})
    plans = [plan(0, judge=[0, 1]), plan(1, judge=[0, 2]), plan(2, judge=[2])]
    assert run(spec, plans, judge=judge) == [False, True, True]


def test_several_shown_samples_negated_none_may_hold() -> None:
    judge = batch("judge", ("yes", "stop"), ("yes!", "stop"), ("no", "stop"), ("nope", "stop"))
    spec = node(NOT_YES, inputs={"judge": "all"})
    plans = [plan(0, judge=[0, 1]), plan(1, judge=[0, 2]), plan(2, judge=[2, 3])]
    assert run(spec, plans, judge=judge) == [True, True, False]


def test_every_condition_must_hold() -> None:
    judge = batch("judge", ("yes", "stop"), ("yes", "stop"), ("no", "stop"))
    test = batch("test", ("ok", TOOL_STOP), ("bad", TOOL), ("ok", TOOL_STOP))
    spec = node(
        YES,
        WhenSpec(node="test", fn="terminal"),
        inputs={"judge": "per_sample", "test": "first"},
    )
    plans = [plan(i, judge=[i], test=[i]) for i in range(3)]
    assert run(spec, plans, judge=judge, test=test) == [False, True, True]


def test_decode_is_asked_with_the_input_node() -> None:
    seen: list[tuple[str, list[int]]] = []

    def spy(node_name: str, ids: Sequence[int]) -> str:
        seen.append((node_name, list(ids)))
        return decode(node_name, ids)

    judge = batch("judge", ("hi", "stop"))
    batches = {"judge": judge}
    assert skipped(node(YES), [plan(0, judge=[0])], batches, index_of(batches), spy) == [True]
    assert seen == [("judge", [ord("h"), ord("i")])]


# --- the rows of a skipped invocation --------------------------------------------------------


def test_skipped_rows_promise_every_sample_and_train_none() -> None:
    p = plan(2, judge=[0], code=[1])
    rows = skipped_rows(p, 3, step=7, version=4, now=12.5)
    assert [r["sample_id"] for r in rows] == ["e0/act/2/0", "e0/act/2/1", "e0/act/2/2"]
    assert list(p.sample_ids(3)) == [r["sample_id"] for r in rows]
    for r in rows:
        assert r["group_id"] == "e0/act/2" and r["node"] == "act" and r["episode"] == "e0"
        assert tuple(r["parent_ids"]) == ("e0/judge/0/0", "e0/code/0/1")
        assert r["step"] == 7 and r["policy_version"] == 4
        assert r["prompt_ids"] == [] and r["response_ids"] == [] and r["logprobs"] == []
        assert r["finish_reason"] == SKIPPED == "skipped"
        assert r["gen_start"] == r["gen_end"] == 12.5
    stored = SampleBatch.from_rows(rows)
    assert len(stored) == 3 and not stored.trained.any()
    assert stored.parent_ids[0] == "e0/judge/0/0,e0/code/0/1"
    assert stored.prompt_lengths.tolist() == [0, 0, 0]
    assert stored.response_lengths.tolist() == [0, 0, 0]
    assert len(stored.trainable()) == 0


def test_skipped_rows_of_zero_samples() -> None:
    assert skipped_rows(plan(0, judge=[0]), 0, 0, 0, 0.0) == []


def test_a_stop_row_is_trained_beside_skipped_ones() -> None:
    rows = skipped_rows(plan(0, judge=[0]), 2, 1, 1, 3.0)
    rows.append(row("e0/act/1/0", "x=1", "stop", step=1, policy_version=1))
    stored = SampleBatch.from_rows(rows)
    assert stored.trained.tolist() == [False, False, True]
    kept = stored.trainable()
    assert kept.sample_id.tolist() == ["e0/act/1/0"]
    assert decode("act", kept.response(0).tolist()) == "x=1"


def test_trainable_drops_tool_tool_stop_and_skipped_rows() -> None:
    assert set(NOT_TRAINED) == {SKIPPED, TOOL, TOOL_STOP} == {"skipped", "tool", "tool-stop"}
    finishes = ["stop", TOOL, "length", TOOL_STOP, SKIPPED, "partial", "verified"]
    stored = SampleBatch.from_rows([row(f"e0/n/0/{i}", f"t{i}", f) for i, f in enumerate(finishes)])
    assert stored.trained.tolist() == [True, False, True, False, False, True, True]
    kept = stored.trainable()
    assert kept.finish_reason.tolist() == ["stop", "length", "partial", "verified"]
    assert [decode("n", kept.response(i).tolist()) for i in range(len(kept))] == [
        "t0",
        "t2",
        "t5",
        "t6",
    ]
    np.testing.assert_array_equal(kept.logprobs, np.full(8, -0.5, np.float32))


def test_trainable_is_the_batch_itself_when_all_rows_train() -> None:
    stored = batch("n", ("a", "stop"), ("b", "length"))
    assert stored.trainable() is stored
    assert SampleBatch.empty().trained.tolist() == []
    assert len(SampleBatch.empty().trainable()) == 0


@pytest.mark.parametrize("finish", [TOOL, TOOL_STOP, SKIPPED])
def test_one_untrained_row_alone(finish: str) -> None:
    stored = batch("n", ("obs", finish))
    assert stored.trained.tolist() == [False] and len(stored.trainable()) == 0
