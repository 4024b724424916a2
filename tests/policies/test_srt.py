"""`srt`: which nodes draft (those longer than a draft), which agents only the `hf` engine
can then serve, and the MEG that pins such an agent to vLLM, refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.rollout.base import Speculation
from meg.policies import SpeculativeRollout
from policies import rollout_policy
from policies.srt import Speculative
from tests.policies.conftest import load, refused


def test_srt_drafts_on_nodes_longer_than_a_draft() -> None:
    srt = Speculative(SpeculativeRollout(policy="srt", draft=6))
    assert srt.speculation(64) == Speculation(6, 3, 16)
    assert srt.speculation(6) is None  # no more tokens than a draft: sampled plainly


def test_srt_needs_every_drafted_agent_on_the_hf_backend(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"rollout": {"policy": "srt"}}
    spec = load(base, tmp_path)
    assert rollout_policy(spec).hf_only(spec) == {"a", "b"}
    base["agents"]["b"]["backend"] = "vllm"
    err = refused(base, tmp_path)
    assert err.field == "run.rollout" and "(or leave `backend` out) for b" in str(err)
    base["agents"]["b"]["sampling"] = {"max_tokens": 4}  # a verdict: sampled plainly
    spec = load(base, tmp_path)
    assert spec.agents["b"].backend == "vllm" and rollout_policy(spec).hf_only(spec) == {"a"}
