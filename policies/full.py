"""`full` (the default rollout policy): every planned episode of a step runs to completion,
each node's requests sampled in one plain batch — the behaviour `policies.base.Rollout`
defines."""

from __future__ import annotations

from policies.base import ROLLOUTS, Rollout

ROLLOUTS.add("full", Rollout)
