"""The soak benchmark: its growth arithmetic on hand-made series, and a few real steps that
keep it working (a sample per step, the keys, the figures recomputed from the samples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.procs import StepSampler, _short
from bench.soak import KEYS, growth, main, series, summarize


def test_growth_is_measured_from_the_end_of_the_warm_up() -> None:
    steps = list(range(6))
    # warm-up steps 0-2 climb (allocator, caches); from step 3 on: a spike, then back
    g = growth(steps, [50.0, 80.0, 100.0, 104.0, 101.0, 102.0], warmup=3)
    assert g is not None
    assert g["warm"] == 100.0 and g["last"] == 102.0 and g["max"] == 104.0
    assert g["delta_last"] == 2.0 and g["delta_max"] == 4.0
    assert g["rel_max"] == pytest.approx(0.04) and g["rel_last"] == pytest.approx(0.02)
    # least squares through (3, 104), (4, 101), (5, 102): slope -1, over 3 steps: -3%
    assert g["rel_trend"] == pytest.approx(-0.03)


def test_a_steady_leak_is_caught_by_both_definitions() -> None:
    steps = list(range(40))
    rss = [1000.0 + 5.0 * s for s in steps]  # 5 MiB a step: from 1095 at step 19 to 1195
    g = growth(steps, rss, warmup=20)
    assert g is not None
    assert g["rel_max"] == pytest.approx(100 / 1095, abs=1e-4)  # 9.1%: under the target...
    assert g["rel_trend"] == pytest.approx(100 / 1095, abs=1e-4)  # the line agrees
    g = growth(list(range(60)), [1000.0 + 5.0 * s for s in range(60)], warmup=20)
    assert g is not None and g["rel_max"] > 0.10 and g["rel_trend"] > 0.10  # ...not for long


def test_missing_samples_and_empty_sides() -> None:
    # step 2 missed and the process not seen at step 4: both skipped, warm = step 1's value
    g = growth([0, 1, 3, 4, 5], [10, 12, 12, None, 15], warmup=3)
    assert g is not None and g["warm"] == 12 and g["delta_last"] == 3 and g["max"] == 15
    assert growth([0, 1], [1.0, 2.0], warmup=3) is None  # nothing after the warm-up
    assert growth([5, 6], [1.0, 2.0], warmup=3) is None  # nothing before it
    flat = growth([0, 1, 2], [0, 0, 0], warmup=1)  # zero is a fine reference when flat
    assert flat is not None and flat["rel_max"] == 0.0


def _sample(step: int, rss: float, fds: int, threads: int) -> dict[str, object]:
    steady = {"pid": 1, "rss_mb": 500.0, "fds": 30, "sockets": 6, "files": 2, "threads": 9}
    leaky = {"pid": 2, "rss_mb": rss, "fds": fds, "sockets": 4, "files": 3, "threads": threads}
    if fds > 20:  # the leak's descriptors: a socket from step 4, a file from step 6
        leaky |= {"sockets": 5, "files": 2 + fds - 20}
    procs = {"driver": steady, "train-0": leaky}
    return {"step": step, "t": float(step), "procs": procs, "processes": 4 + (step == 7)}


def test_the_keys_are_the_worst_process() -> None:
    samples = [_sample(s, 100.0 + 3 * s, 20 + (s >= 4) + (s >= 6), 10 + s // 3) for s in range(8)]
    out = summarize(series(samples), warmup=2)
    train = out["per_process"]["train-0"]
    assert train["rss_mb"]["warm"] == 103.0 and train["fds"]["delta_last"] == 2
    assert out["rss_growth_max"] == pytest.approx(18 / 103, abs=1e-4)  # 121 at step 7
    assert out["fds_growth"] == 2 and out["sockets_growth"] == 1
    assert out["open_files_growth"] == 1 and out["threads_growth"] == 2  # 10 -> 12
    assert out["per_process"]["driver"]["rss_mb"]["rel_max"] == 0.0
    assert out["processes_growth"] == 1  # one more process in the tree at the end
    assert out["soak_ok"] is False and not train["restarted"]
    flat = summarize(series([_sample(s, 100.0, 20, 10) for s in range(5)]), warmup=2)
    assert flat["soak_ok"] is True and flat["rss_growth_trend"] == 0.0
    # a process seen only after the warm-up (a restarted child under a new label) has no
    # growth of its own; the keys come from the others
    late = [_sample(s, 100.0, 20, 10) for s in range(5)]
    for s in late[2:]:
        s["procs"]["rollout-0/reward_child#0"] = {"pid": 9, "rss_mb": 70.0, "fds": 5}  # type: ignore[index]
    out = summarize(series(late), warmup=2)
    assert out["per_process"]["rollout-0/reward_child#0"]["rss_mb"] is None
    assert out["soak_ok"] is True


def test_a_step_is_finished_once_every_agent_has_recorded_it(tmp_path: Path) -> None:
    for agent, steps in (("solver", (0, 1, 2)), ("verifier", (0, 1))):
        log = tmp_path / "store" / "run-1" / agent / "consumed"
        log.mkdir(parents=True)
        for k in steps:
            (log / f"{k}.json").write_text("{}")
    (log / "notes.txt").write_text("")  # not a record
    sampler = StepSampler(tmp_path, ["solver", "verifier"], client=None)
    assert sampler.finished_steps() == {0, 1}
    assert StepSampler(tmp_path, ["solver", "critic"], client=None).finished_steps() == set()
    assert _short(["/venv/bin/python", "-m", "tasks.reward_child"]) == "reward_child"
    assert _short(["/usr/bin/sandbox-run", "--x"]) == "sandbox-run"


@pytest.mark.slow
def test_soak_bench_small(tmp_path: Path, cluster: str) -> None:
    """The headline (RSS growth <= 7.2%, no growth of open files or threads, after a 50-step
    warm-up of 200 steps) is not asserted here: 3 steps after a 2-step warm-up still see the
    allocator, caches and connection pools settle. Its arithmetic is checked on the
    hand-made series above; this run checks that the figures are those of the samples, on
    the session's cluster (`--scheduler`: a fresh one would cost its start, and no growth is
    asserted here)."""
    out, png = tmp_path / "soak.json", tmp_path / "soak.png"
    res = main(["--small", "--json", str(out), "--png", str(png), "--scheduler", cluster])
    assert json.loads(out.read_text()) == res
    assert png.stat().st_size > 1000
    r = res["workloads"]["math-chain"]
    assert res["steps"] == 5 and res["warmup"] == 2 and list(res["workloads"]) == ["math-chain"]
    assert r["steps_run"] == 5 and r["violations"] == 0 and r["step_s"] > 0
    cols = r["samples"]
    assert cols["steps"] == sorted(cols["steps"]) and r["sampled_steps"] == len(cols["steps"])
    assert len(cols["steps"]) + r["missed_steps"] == 5 and len(cols["steps"]) >= 3
    assert {"driver", "rollout-0", "train-0"} <= set(cols["procs"])
    assert all(n >= 3 for n in cols["processes"])
    for c in cols["procs"].values():
        assert all(x is not None and x > 0 for m in ("rss_mb", "fds", "threads") for x in c[m])
    again = summarize(cols, res["warmup"])  # the figures are those of the recorded samples
    for key in KEYS:
        assert r[key] == again[key] and res[key] == r[key]
    assert isinstance(res["soak_ok"], bool)
    # the test's Prefect server is a child of this process: its pools were filled first
    pools = res["server_pools"]
    assert [p["burst"] for p in pools] == [0, 1, 4, 16, 64]
    assert all(p["files"] > 0 and p["threads"] > 0 for p in pools)
    assert pools[-1]["threads"] >= pools[0]["threads"]
