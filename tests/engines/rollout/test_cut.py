"""A `Cut` stops a batch once enough groups are complete, on every backend, the same way twice."""

from __future__ import annotations

import pytest

from engines.rollout.base import BadRequestError, Cut, RolloutBackend, SamplingParams

PROMPTS = [[1, 5, 6, 7]] * 12
PARAMS = SamplingParams(n=1, temperature=1.0, max_tokens=40, seed=3)
GROUPS = tuple(i // 2 for i in range(12))


def complete_groups(outs: list) -> set[int]:
    done: dict[int, bool] = {}
    for g, out in zip(GROUPS, outs, strict=True):
        done[g] = done.get(g, True) and out[0].finish_reason != "partial"
    return {g for g, ok in done.items() if ok}


def test_cut_stops_at_the_quota_and_keeps_partial_work(backend: RolloutBackend) -> None:
    """Groups 0 and 5 have a 4-token budget, the others 40: once those two are complete the
    quota (2, group 5 required) is met and the batch stops, the other groups' requests left
    partial. Ignoring the cut would run every request to its end: no `partial` (before, with
    one budget for all, the quota was met only at the last token and the test passed with
    the cut ignored)."""
    budgets = tuple(4 if g in (0, 5) else 40 for g in GROUPS)
    cut = Cut(groups=GROUPS, quota=2, must_finish=frozenset({5}), max_tokens=budgets)
    outs = backend.generate(PROMPTS, PARAMS, cut=cut)
    assert {0, 5} <= complete_groups(outs)
    partial = [o[0] for o in outs if o[0].finish_reason == "partial"]
    assert partial, "the cut did not stop anything"
    assert all(len(c.response_ids) < 40 for c in partial)  # stopped before their budget
    for out, limit in zip(outs, budgets, strict=True):
        c = out[0]
        assert c.finish_reason in ("stop", "length", "partial")
        assert len(c.logprobs) == len(c.response_ids) and len(c.response_ids) <= limit
    again = backend.generate(PROMPTS, PARAMS, cut=cut)
    assert [o[0].response_ids for o in outs] == [o[0].response_ids for o in again]


def test_cut_needs_one_request_per_prompt(backend: RolloutBackend) -> None:
    with pytest.raises(BadRequestError, match="n=1"):
        backend.generate(PROMPTS, SamplingParams(n=2), cut=Cut(groups=GROUPS, quota=1))
    with pytest.raises(BadRequestError, match=r"Cut\.groups"):
        backend.generate(PROMPTS, PARAMS, cut=Cut(groups=(0,), quota=1))
