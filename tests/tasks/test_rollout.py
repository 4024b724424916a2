"""The version rule of the generate task (`ensure_weights`): which published policy version a
rollout host must sample with, per mode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from engines.training.publish import publish_weights
from tasks.context import RunContext
from tasks.rollout import ensure_weights
from tasks.worker import state_of

AGENT = "solver"


@dataclass
class FakeHost:
    """Only what `ensure_weights` touches (`held`, `load`), with a real host's rule: load
    through the loader only when holding another version. These tests are about which
    version is asked for, not about loading weights into an inference engine."""

    version: int = 0
    loaded: list[tuple[int, float]] = field(default_factory=list)  # (version, weight value)

    def held(self, agent: str) -> int:
        return self.version

    def load(self, agent: str, version: int, loader: Callable[[], Any]) -> bool:
        if self.version >= version:
            return False
        tensors, meta = loader()
        assert meta["agent"] == agent and meta["version"] == version
        self.loaded.append((version, float(tensors["w"][0])))
        self.version = version
        return True


def publish(ctx: RunContext, *versions: int) -> None:
    for v in versions:  # each version's weights hold its number, to tell them apart
        publish_weights(state_of(ctx), AGENT, v, {"w": torch.full((2,), float(v))})


@pytest.mark.parametrize("mode", ["flex", "sync"])
def test_flex_and_sync_load_exactly_the_needed_version(new_ctx, mode: str) -> None:
    ctx = new_ctx(mode=mode)
    host = FakeHost()
    assert ensure_weights(ctx, host, AGENT, 0) == 0  # the initial policy: nothing to load
    publish(ctx, 1, 2)
    assert ensure_weights(ctx, host, AGENT, 1) == 1  # not the newest (2)
    assert host.loaded == [(1, 1.0)]
    assert ensure_weights(ctx, host, AGENT, 1) == 1  # already held: not loaded again
    assert ensure_weights(ctx, host, AGENT, 2) == 2
    assert host.loaded == [(1, 1.0), (2, 2.0)]


@pytest.mark.parametrize("mode", ["flex", "sync"])
def test_flex_and_sync_refuse_a_host_holding_a_newer_version(new_ctx, mode: str) -> None:
    ctx = new_ctx(mode=mode)
    publish(ctx, 1, 2)
    host = FakeHost(version=2)
    with pytest.raises(
        RuntimeError, match=rf"'solver'.*holds version 2.*{mode} rollout must sample with version 1"
    ):
        ensure_weights(ctx, host, AGENT, 1)
    assert (host.version, host.loaded) == (2, [])


def test_async_takes_the_newest_published_version(new_ctx) -> None:
    ctx = new_ctx(mode="async", staleness=1)
    publish(ctx, 1, 2)
    host = FakeHost()
    assert ensure_weights(ctx, host, AGENT, 1) == 2
    assert host.loaded == [(2, 2.0)]
    assert ensure_weights(ctx, host, AGENT, 1) == 2  # a newer policy is fine in async
    publish(ctx, 3)
    assert ensure_weights(ctx, host, AGENT, 2) == 3
    assert host.loaded == [(2, 2.0), (3, 3.0)]


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_a_version_not_yet_published_raises_naming_the_agent(new_ctx, mode: str) -> None:
    ctx = new_ctx(mode=mode, staleness=1 if mode == "async" else 0)
    host = FakeHost()
    with pytest.raises(RuntimeError, match=r"agent 'solver': version 1 is required .* is None"):
        ensure_weights(ctx, host, AGENT, 1)
    publish(ctx, 1, 2)
    with pytest.raises(RuntimeError, match=r"agent 'solver': version 3 is required .* is 2"):
        ensure_weights(ctx, host, AGENT, 3)
    assert (host.version, host.loaded) == (0, [])


def test_srt_drafts_where_a_node_has_room_for_a_draft(new_ctx, tiny_model: str) -> None:
    """Under `rollout: srt` (draft 4) the solver's 6-token answers are drafted for; the
    verifier's 4-token verdicts, no longer than one draft, are sampled plainly."""
    from engines.rollout.base import Speculation
    from tasks.rollout import sampling_for
    from tests.tasks.conftest import math_chain

    spec = math_chain(tiny_model).with_run(rollout={"policy": "srt", "draft": 4})
    ctx = new_ctx(spec=spec)
    assert sampling_for(ctx, "solve", 0, 0).speculate == Speculation(4, 3, 16)
    assert sampling_for(ctx, "verify", 0, 0).speculate is None
    plain = new_ctx("plain", spec=math_chain(tiny_model))
    assert sampling_for(plain, "solve", 0, 0).speculate is None
