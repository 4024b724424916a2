"""A `Watch` stops single requests of a batch, on every backend: what it stops is the exact
prefix of what the request would have sampled, the others are untouched, and a re-run stops
the same requests at the same tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from engines.rollout.base import BadRequestError, Cut, RolloutBackend, SamplingParams
from policies.darts import KeepFirst

PROMPTS = [[1, 5, 6, 7]] * 8
PARAMS = SamplingParams(n=1, temperature=1.0, max_tokens=24, seed=11)


@dataclass
class StopEvenAt:
    """Stops even requests once they hold `at` tokens; records what it was shown."""

    at: int
    every: int = 2
    reason: str = "verified"
    shown: list[tuple[int, int]] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)

    def finish(self, i: int) -> None:
        self.ended.append(i)

    def stop(self, i: int, tokens: Sequence[int]) -> bool:
        self.shown.append((i, len(tokens)))
        return i % 2 == 0 and len(tokens) >= self.at


def test_a_watch_stops_single_requests_at_a_prefix_of_their_sample(
    backend: RolloutBackend,
) -> None:
    free = backend.generate(PROMPTS, PARAMS)
    watch = StopEvenAt(at=4)
    outs = backend.generate(PROMPTS, PARAMS, watch=watch)
    stopped = 0
    for i, (f, o) in enumerate(zip(free, outs, strict=True)):
        f, o = f[0], o[0]
        if o.finish_reason == "verified":
            stopped += 1
            assert i % 2 == 0 and len(o.response_ids) == 4  # looked at every 2 tokens
            assert o.response_ids == f.response_ids[:4]
            assert o.logprobs == pytest.approx(f.logprobs[:4], abs=1e-5)
        else:  # odd, or even ended before it was 4 tokens long: as sampled without a watch
            assert o.response_ids == f.response_ids and o.finish_reason == f.finish_reason
    assert stopped == sum(len(f[0].response_ids) >= 4 for f in free[::2]) > 0
    assert all(n % 2 == 0 or i in watch.ended for i, n in watch.shown)  # every 2 tokens
    again = backend.generate(PROMPTS, PARAMS, watch=StopEvenAt(at=4))
    assert [o[0].response_ids for o in again] == [o[0].response_ids for o in outs]


def test_keep_first_stops_a_group_once_enough_ended(backend: RolloutBackend) -> None:
    """Two groups of four; once two of a group ended, the group's others are dropped."""
    watch = KeepFirst([i // 4 for i in range(8)], keep=2)
    outs = [o[0] for o in backend.generate(PROMPTS, PARAMS, watch=watch)]
    for g in range(2):
        group = outs[4 * g : 4 * g + 4]
        ended = [c for c in group if c.finish_reason in ("stop", "length")]
        dropped = [c for c in group if c.finish_reason == "dropped"]
        assert len(ended) + len(dropped) == 4 and len(ended) >= 2
        # a dropped response was no longer than the second one to end when it stopped
        second = sorted(len(c.response_ids) for c in ended)[1]
        assert all(len(c.response_ids) <= second for c in dropped)


def test_a_watch_needs_single_requests_and_no_cut(backend: RolloutBackend) -> None:
    with pytest.raises(BadRequestError, match="n=1"):
        backend.generate(PROMPTS, SamplingParams(n=2), watch=StopEvenAt(at=1))
    with pytest.raises(BadRequestError, match="not both"):
        backend.generate(PROMPTS, PARAMS, cut=Cut(groups=(0,) * 8, quota=1), watch=StopEvenAt(1))
