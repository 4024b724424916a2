"""The rollout policies' single-request rules as a generate task uses them (`tasks.watch`):
which watch a node gets, and which of a group's completions it keeps."""

from __future__ import annotations

import pytest

from engines.rollout.base import Completion, SamplingParams
from meg.policies import AprilRollout, DartsRollout, FullRollout, RollVerify
from tasks.watch import KeepFirst, Verify, keep_first, sample_watched, watch_for
from workloads.datasets import TaskItem

TASKS = [TaskItem("t0", "q0", "1 2 3"), TaskItem("t1", "q1", "4")]


def never(text: str, task: TaskItem) -> bool:
    return False


def comp(length: int, reason: str = "stop") -> Completion:
    return Completion(tuple(range(length)), (-1.0,) * length, reason)


def test_each_policy_gets_its_watch_only_where_it_applies() -> None:
    def decode(ids: object) -> str:
        return ""

    assert watch_for(FullRollout(), 4, never, TASKS, decode) is None
    assert watch_for(AprilRollout(policy="april"), 4, never, TASKS, decode) is None
    verify = RollVerify(policy="rollverify", every=3)
    assert watch_for(verify, 4, None, TASKS, decode) is None  # no prefix verdict at this node
    watch, launched = watch_for(verify, 2, never, TASKS, decode)  # type: ignore[misc]
    assert isinstance(watch, Verify) and launched == 2 and watch.every == 3
    assert [t.id for t in watch.tasks] == ["t0", "t0", "t1", "t1"]  # per request
    watch, launched = watch_for(DartsRollout(policy="darts"), 2, never, TASKS, decode)  # type: ignore[misc]
    assert isinstance(watch, KeepFirst) and launched == 3 and watch.keep == 2
    assert list(watch.groups) == [0, 0, 0, 1, 1, 1]


def test_keep_first_stops_a_group_once_it_has_enough() -> None:
    w = KeepFirst([0, 0, 0, 1, 1, 1], keep=2)
    w.finish(0)
    assert not w.stop(1, [5])
    w.finish(2)
    assert w.stop(1, [5]) and not w.stop(3, [5])  # group 0 is full, group 1 is not


def test_keep_first_keeps_the_shortest_that_ended_in_sample_order() -> None:
    group = [comp(5), comp(2, "dropped"), comp(3), comp(3, "length"), comp(1, "dropped")]
    assert keep_first(group, 2) == [group[2], group[3]]  # 3 and 3 tokens, not the 5
    assert keep_first(group, 1) == [group[2]]  # a tie: the lower index
    plain = [comp(4), comp(9)]
    assert keep_first(plain, 2) == plain  # nothing dropped, nothing extra: as sampled
    with pytest.raises(RuntimeError, match="kept 1 finished responses of 2"):
        keep_first([comp(3), comp(1, "dropped")], 2)


def test_sample_watched_regroups_single_requests_per_prompt() -> None:
    seen = {}

    def generate(prompts, params, watch):  # type: ignore[no-untyped-def]
        seen.update(n=params.n, prompts=len(prompts), watch=watch)
        return [[comp(len(prompts) - i)] for i in range(len(prompts))]

    params = SamplingParams(n=2, max_tokens=8, seed=1)
    watch = KeepFirst([0] * 6, 2)
    out, discarded = sample_watched(generate, [[1], [2]], params, launched=3, watch=watch)
    assert seen["n"] == 1 and seen["prompts"] == 6
    # lengths 6 5 4 | 3 2 1, none dropped: the two shortest of each prompt, in sample order
    assert [[len(c.response_ids) for c in group] for group in out] == [[5, 4], [2, 1]]
    assert discarded == 6 + 3  # generated, not kept


def test_verify_decodes_incrementally_and_decides_as_the_full_decode(tiny_model: str) -> None:
    """With the fast tokenizer's backend, each token is decoded once and only a verdict of
    "decided" is checked on the full decode: the stops are exactly those of judging the full
    decode of every prefix, with one full decode per stop."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    full_decodes = []

    def decode(ids: object) -> str:
        full_decodes.append(1)
        return tok.decode(list(ids), skip_special_tokens=True)  # type: ignore[call-overload]

    def has_digit_then_more(text: str, task: TaskItem) -> bool:
        return any(c.isdigit() for c in text[:-1])

    rng = random.Random(0)
    rows = [[rng.randrange(len(tok)) for _ in range(40)] for _ in range(6)]
    fast = Verify(
        has_digit_then_more, [TASKS[0]] * 6, decode, every=1, backend=tok.backend_tokenizer
    )
    slow = Verify(has_digit_then_more, [TASKS[0]] * 6, decode, every=1)
    stops = 0
    for i, row in enumerate(rows):
        for n in range(1, len(row) + 1):
            full_decodes.clear()
            stop = fast.stop(i, row[:n])
            assert len(full_decodes) == int(stop)  # a full decode only to confirm a stop
            assert stop == slow.stop(i, row[:n]) == has_digit_then_more(decode(row[:n]), TASKS[0])
            if stop:
                stops += 1
                break
    assert stops > 0  # the rule did stop rows (and each stop was confirmed once)
