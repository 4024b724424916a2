"""The rollout benchmark's --small run: keys and sanity, never timings.

`balance_speedup` (1.52-2.19x at full size) is a makespan of measured generation times, so
its value is not asserted, nor which split the balancer ends on (it decides from those
measured times); the direction of a split on skewed demand is the pure balancer's test. `ratio_vs_direct_vllm` and
`vllm_after_update_ratio` (both ~1.0) are wall-clock with no direction to hold; what they
rest on is asserted: the same tokens on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.rollout import main
from meg import load_meg
from workloads import BUILTIN


@pytest.mark.slow
def test_rollout_bench_small_writes_all_metrics(tmp_path: Path) -> None:
    out = tmp_path / "rollout.json"
    r = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))
    for key in (
        "vllm_tok_s",
        "hf_tok_s",
        "balance_speedup",
        "vllm_after_update_ratio",
        "vllm_update_s",
        "vllm_load_s",
        "ratio_vs_direct_vllm",
        "task_tok_s",
        "direct_tok_s",
    ):
        assert r[key] > 0, key
    # an updated engine holds the same weights as the fresh one: same samples
    assert r["after_update_same_outputs"] is True
    # task path and direct vLLM were given the same prompts and seeds: same tokens
    assert r["task_same_tokens"] is True
    n = load_meg(BUILTIN["math-chain"], check_models=False).nodes["solve"].n
    assert r["task_batch"]["sequences"] == 16 * n  # 16 episodes x n samples of the solve node
    assert 0 < r["task_batch"]["tokens_per_call"] <= 16 * n * r["task_batch"]["max_tokens"]
    assert set(r["off"]["idle_fraction"]) == {f"host{i}" for i in range(r["hosts"])}
    for arm in ("off", "on"):
        assert all(0.0 <= f < 1.0 for f in r[arm]["idle_fraction"].values())
        assert sum(r[arm]["final_hosts"].values()) == r["hosts"]
    assert r["off"]["final_hosts"] == {"planner": 2, "solver": 1, "verifier": 1}
    assert r["off"]["swaps"] == 0
    # the "on" arm's balancer decides from the measured seconds of real vLLM calls: whether
    # it moves a host in 2 steps, and to which agent, depends on the machine (a slow call on
    # a loaded CI machine can make the verifier look heavier), so only what holds either way
    # is asserted here; that skewed demand moves the spare host to the heavy agent is the
    # pure balancer's test (test_balancer.py::test_skewed_demand_moves_hosts_...). Nor do
    # the final hosts tell whether weights were swapped: a move decided at the last step's
    # end is never carried out (CI saw final hosts moved with 0 swaps), and a trial that
    # undoes a move leaves the first hosts after two swaps. A swap is a host taking another
    # agent's weights at a step's start: at most one per host and step after the first.
    assert 0 <= r["on"]["swaps"] <= r["hosts"] * (r["steps"] - 1)
