"""The teammate draw of external-policy rollouts (`tasks.external.sample_external`): the
rows are labelled with the version that sampled them, the teammate's newest published, and
a draw whose host moved to another version meanwhile (the teammate's own task loaded one)
fails, to be retried, rather than label rows with a version that may not have written them.
The host is the version-rule stand-in of `test_rollout.py` (the version asked for and held,
not an inference engine); the published versions are real StateStore entries."""

from __future__ import annotations

from typing import Any

import pytest

import tasks.external
from engines.rollout.base import Completion, SamplingParams
from meg.policies import ExternalSource
from tasks.external import sample_external
from tasks.rollout import ensure_weights
from tests.tasks.test_rollout import AGENT, FakeHost, publish

DONE = Completion(response_ids=(5,), logprobs=(-1.0,), finish_reason="stop")


class DrawHost(FakeHost):
    """Answers one completion a prompt; `moves_to`: the version the teammate's own task
    loads onto the host while this draw waits for it."""

    moves_to: int | None = None

    def generate(self, prompts: Any, params: SamplingParams, agent: str) -> list[list[Any]]:
        if self.moves_to is not None:
            self.version = self.moves_to
        return [[DONE] * params.n for _ in prompts]


@pytest.mark.parametrize("moves_to", [None, 3])
def test_a_teammate_draw_is_labelled_with_the_version_that_sampled_it(
    new_ctx: Any, monkeypatch: pytest.MonkeyPatch, moves_to: int | None
) -> None:
    ctx = new_ctx()
    publish(ctx, 1, 2)
    host = DrawHost()
    host.moves_to = moves_to
    monkeypatch.setattr(tasks.external, "host_of", lambda ctx, agent, unit=None: (host, 0.0))
    source = ExternalSource(agent=AGENT, rows=2)
    params = SamplingParams(n=2, max_tokens=4)
    if moves_to is None:
        outs, label = sample_external(ctx, "learner", source, [[1], [2]], params, ensure_weights)
        assert label == f"agent:{AGENT}@v2" and host.held(AGENT) == 2  # the newest published
        assert [len(o) for o in outs] == [2, 2]
        return
    with pytest.raises(RuntimeError, match="moved from version 2 to 3 while it sampled"):
        sample_external(ctx, "learner", source, [[1]], params, ensure_weights)
