"""The simulator's headline, against the recorded end-to-end run (`bench/results/e2e.json`,
the run `bench/sim/calibration.py`'s `cpu-here` constants were fitted on): every arm it can
replay within 15% of its measured step time, the fitted arms told apart from the held-out
ones. Simulated seconds against recorded ones: no wall clock, deterministic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.sim.validate import summary, validate

E2E = Path(__file__).resolve().parents[3] / "bench" / "results" / "e2e.json"
# fitted on their own measurements: task costs on `flex`, the effective cores on the step
# times of `flex` and `marti-like` (docs/simulator.md, "Calibration"); the rest are held out
IN_SAMPLE = ("flex", "marti-like")


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict[str, Any]]:
    """The recorded run replayed once for the module (12 arms, ~15 s)."""
    return validate(E2E)


def test_the_recorded_arms_are_predicted_within_15_percent(
    recorded: dict[str, dict[str, Any]],
) -> None:
    v = recorded
    assert len(v) == 12  # 6 replayable arms × fanout, math-chain (no *-prefect-per-node)
    held_out = {k: x["error"] for k, x in v.items() if k.split("/")[1] not in IN_SAMPLE}
    assert len(held_out) == 8
    assert all(abs(e) < 0.15 for e in held_out.values()), held_out
    assert all(abs(x["error"]) < 0.15 for x in v.values())
    for wl in ("fanout", "math-chain"):
        flex = v[f"{wl}/flex"]["predicted_s"]
        # two of the held-out arms replay flex's placement on one rollout worker: the
        # simulator predicts them at flex's (fitted) step time, so they check the
        # measurement's noise more than the model
        assert (
            v[f"{wl}/flex-nobalance"]["predicted_s"] == flex == v[f"{wl}/flex-dask"]["predicted_s"]
        )
        # speedup_flex_vs_sync's direction, as measured (1.41x, 1.23x): held out, and kept
        assert v[f"{wl}/sync"]["predicted_s"] > flex


def test_only_held_out_arms_count_as_checks(recorded: dict[str, dict[str, Any]]) -> None:
    v = recorded
    roles = {k: x["role"] for k, x in v.items()}
    assert roles["fanout/flex"] == roles["math-chain/marti-like"] == "fitted"
    assert roles["fanout/flex-dask"] == roles["math-chain/flex-nobalance"] == "twin of flex"
    assert {k for k, r in roles.items() if r == "held out"} == {
        f"{wl}/{arm}" for wl in ("fanout", "math-chain") for arm in ("sync", "async-1")
    }
    s = summary(v)
    assert (s["fitted"], s["twin"], s["held out"]) == (4, 4, 4)
    held = [abs(x["error"]) for x in v.values() if x["role"] == "held out"]
    assert s["heldout_max_abs_error"] == max(held)


def test_a_file_of_other_runs_is_held_out_at_its_own_micro_batches(
    tmp_path: Path, recorded: dict[str, dict[str, Any]]
) -> None:
    res = json.loads(E2E.read_text())
    marti = res["workloads"]["math-chain"]["arms"]["marti-like"]
    res["workloads"] = {"math-chain": {"arms": {"marti-like": {**marti, "micro_batches": 1}}}}
    res["workloads"]["math-chain"]["arms"]["flex"] = {"step_s": 2.0}
    other = tmp_path / "e2e_other.json"
    other.write_text(json.dumps(res))
    # the same file as the calibration run and as a held-out file; a missing file is skipped
    v = validate(other, heldout=(other, tmp_path / "missing.json"))
    assert len(v) == 4
    assert v["math-chain/marti-like"]["role"] == "fitted"
    assert v["math-chain/flex (e2e_other)"]["role"] == "day reference"  # drift, not a check
    one = v["math-chain/marti-like (e2e_other)"]
    assert one["role"] == "held out, ratio" and one["micro_batches"] == 1
    # one micro-batch a step is another schedule: another prediction than at two
    assert one["predicted_s"] != recorded["math-chain/marti-like"]["predicted_s"]
    # checked as a ratio to its own run's flex: the day's speed cancels
    flex = v["math-chain/flex (e2e_other)"]
    predicted = one["predicted_s"] / flex["predicted_s"]
    measured = one["measured_s"] / 2.0
    assert one["ratio_error"] == pytest.approx(predicted / measured - 1, abs=2e-3)
    s = summary(v)
    assert (s["fitted"], s["day reference"], s["held out, ratio"]) == (2, 1, 1)
    assert s["heldout_ratio_mean_abs_error"] == abs(one["ratio_error"])
