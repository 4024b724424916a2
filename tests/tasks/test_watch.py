"""How a generate task samples under a rollout policy's watch (`tasks.watch`): one request
per sample, and which of a group's completions it keeps. Which watch a node gets is the
policy's (tests/policies/)."""

from __future__ import annotations

import pytest

from engines.rollout.base import Completion, SamplingParams
from policies.darts import KeepFirst
from tasks.watch import keep_first, sample_watched
from workloads.datasets import TaskItem

TASKS = [TaskItem("t0", "q0", "1 2 3"), TaskItem("t1", "q1", "4")]


def comp(length: int, reason: str = "stop") -> Completion:
    return Completion(tuple(range(length)), (-1.0,) * length, reason)


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
