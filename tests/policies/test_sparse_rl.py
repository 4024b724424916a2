"""`sparse` (Sparse-RL): every sampling agent decodes from a bounded KV cache, only on the
`hf` backend, with the loss that corrects for the sparse sampler (given by the run to an
agent that names no anchor); `meg validate` names a misspelt parameter, an impossible
budget, a vLLM agent and an agent naming another anchor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.rollout.base import SparseKV
from meg.policies import SparseRollout
from policies import implied, rollout_policy
from policies.sparse_rl import SparseRL
from tests.policies.conftest import load, refused

CORRECTED = {"loss": {"old_logprobs": "sparse_rl"}}


def sparse(base: dict[str, Any], **params: Any) -> dict[str, Any]:
    """`base` under the sparse policy, both agents with the correcting anchor."""
    base["run"] = {"rollout": {"policy": "sparse", **params}}
    for agent in base["agents"].values():
        agent |= CORRECTED
    return base


def test_every_node_decodes_with_the_policy_s_budget() -> None:
    rollout = SparseRL(SparseRollout(policy="sparse", budget=16, sinks=2, window=4, every=2))
    assert rollout.kv_budget(4) == rollout.kv_budget(512) == SparseKV(16, 2, 4, 2)


def test_sparse_loads_and_a_misspelt_parameter_names_itself(
    base: dict[str, Any], tmp_path: Path
) -> None:
    spec = load(sparse(base, budget=32), tmp_path)
    assert spec.run.rollout == SparseRollout(policy="sparse", budget=32)
    assert rollout_policy(spec).hf_only(spec) == {"a", "b"}
    err = refused(sparse(base, budgit=32), tmp_path)
    assert err.field == "run.rollout.sparse.budgit"


def test_an_impossible_budget_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    err = refused(sparse(base, budget=8, sinks=4, window=6), tmp_path)
    assert "sinks + window (4 + 6) exceed the budget (8)" in str(err)
    assert "budget" in str(refused(sparse(base, budget=1), tmp_path))  # below its bound
    assert load(sparse(base, budget=8, sinks=2, window=6), tmp_path)  # sinks + window = budget


def test_a_vllm_agent_is_refused_with_the_fix(base: dict[str, Any], tmp_path: Path) -> None:
    data = sparse(base)
    data["agents"]["b"]["backend"] = "vllm"
    err = refused(data, tmp_path)
    assert err.field == "run.rollout" and "(or leave `backend` out) for b" in str(err)


def test_an_agent_naming_another_anchor_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    data = sparse(base)
    data["agents"]["a"]["loss"] = {"old_logprobs": "behaviour"}
    err = refused(data, tmp_path)
    assert err.field == "run.rollout" and "or set `sparse_rl` for a" in str(err)


def test_an_agent_naming_no_anchor_is_given_the_correction(
    base: dict[str, Any], tmp_path: Path
) -> None:
    data = sparse(base)
    del data["agents"]["a"]["loss"]  # b names it itself
    spec = load(data, tmp_path)
    done, sources, notes = implied(spec)
    assert {n: s.loss.old_logprobs for n, s in done.agents.items()} == {
        "a": "sparse_rl",
        "b": "sparse_rl",
    }
    assert sources == {"agents.a.loss.old_logprobs": "policy"}
    assert notes == [
        "agent a: loss anchor sparse_rl (what the sparse rollout policy's samples need)"
    ]
    assert implied(done)[1] == {}  # decided once: the settled spec names it
    assert (
        done.agents["b"] == spec.agents["b"] and spec.agents["a"].loss.old_logprobs != "sparse_rl"
    )


def test_other_policies_imply_no_anchor(base: dict[str, Any], tmp_path: Path) -> None:
    spec = load(base, tmp_path)
    assert implied(spec) == (spec, {}, [])
