"""Validation: the simulator against `bench/e2e.py`'s measured arms on this machine.

Each measured arm is replayed with the same MEG (the e2e copy of the built-in workload),
steps, episodes, micro-batches, mode, balancing and worker layout — one rollout and one
training worker with 2 training slots (`ClusterConfig()`), or for `marti-like` one
colocated worker per agent — on the `cpu-here` profile, and its predicted `step_s` (the
same definition as `bench.e2e.steady_state`) is compared with the measured one.

Arms whose difference is Prefect's per-node task runs (`*-prefect-per-node`) are not
replayed: the simulator models Dask's dispatch, not Prefect's task-run bookkeeping.

Each replayed arm has a role, so that only real checks are counted as checks:

- `fitted`: its measurements set constants (`flex`: task costs; `marti-like` of the
  calibration run: the effective cores);
- `twin of <arm>`: simulated exactly as a fitted arm (`flex-nobalance` and `flex-dask`
  run `flex`'s placement on one rollout worker), so its error measures the run-to-run noise
  of the measurement, not the model;
- `held out`: nothing of it entered the model.

Runs from other files (`validate(..., heldout=[...])`, e.g. `bench/results/e2e_layout.json`:
MARTI's whole-batch schedule, another day) were measured on a machine whose speed moves by
tens of percent from day to day (a shared VM), which no constant here knows. Their `flex`
arm is simulated exactly as the fitted one: its error is that day's drift (`day
reference`), not a check. Every other arm is checked as a ratio to its own run's `flex`
(`held out, ratio`: `ratio_error` = predicted arm/flex over measured arm/flex, − 1), which
the day's speed cancels from.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.sim.calibration import EMPIRICAL_LENGTHS, EMPIRICAL_PROMPTS
from bench.sim.costs import Costs, profile
from bench.sim.lengths import Quantiles
from bench.sim.replay import Arm, Layout, simulate
from meg import MEGSpec

ROLLOUT, TRAIN = "rollout-0", "train-0"


def one_each(n_agents: int) -> Layout:
    """`ClusterConfig()`: one rollout worker, one training worker, 2 training slots."""
    return Layout((ROLLOUT,), (TRAIN,), {ROLLOUT: 1, TRAIN: 1}, 2)


def per_agent(n_agents: int) -> Layout:
    """`bench.e2e.per_agent_cluster`: one colocated worker per agent (names sort like the
    real ones: worker-0 … worker-N-1)."""
    ws = tuple(f"worker-{i}" for i in range(n_agents))
    return Layout(ws, ws, dict.fromkeys(ws, 1), 2)


@dataclass(frozen=True, slots=True)
class E2EArm:
    arm: Arm
    layout: Callable[[int], Layout]


FITTED = ("flex", "marti-like")  # in the calibration run (calibration.CPU_HERE)
TWINS = {"flex-nobalance": "flex", "flex-dask": "flex"}  # simulated exactly as the fitted arm
E2E_ARMS: dict[str, E2EArm] = {
    "sync": E2EArm(Arm("sync"), one_each),
    "flex": E2EArm(Arm("flex"), one_each),
    "flex-nobalance": E2EArm(Arm("flex", balance=False), one_each),
    "async-1": E2EArm(Arm("async", 1), one_each),
    "flex-dask": E2EArm(Arm("flex"), one_each),
    "marti-like": E2EArm(Arm("sync", balance=False), per_agent),
}


@dataclass(frozen=True, slots=True)
class Sizes:
    steps: int
    episodes: int
    micro_batches: int = 2  # bench.e2e.config_copy


def e2e_specs(e2e_json: Path, workloads: tuple[str, ...] = ()) -> tuple[dict[str, MEGSpec], Sizes]:
    """The MEGs `bench/e2e.py` ran (its `config_copy`), and its sizes, from its JSON."""
    from bench.e2e import config_copy
    from flows.runs.config import load_config

    res = json.loads(e2e_json.read_text())
    sizes = Sizes(int(res["steps"]), int(res["episodes_per_step"]))
    names = workloads or tuple(res["workloads"])
    with tempfile.TemporaryDirectory() as tmp:
        specs = {
            wl: load_config(
                str(config_copy(wl, "models/tiny-math", Path(tmp), sizes.steps, sizes.episodes)),
                check_models=False,
            )
            for wl in names
        }
    return specs, sizes


def agents_of(spec: MEGSpec) -> int:
    return len({n.agent for n in spec.nodes.values()})


def predict(spec: MEGSpec, arm: str, sizes: Sizes, costs: Costs) -> float:
    """Predicted step_s of one e2e arm (at `sizes.micro_batches`, the arm's own)."""
    e = E2E_ARMS[arm]
    lengths = {n: Quantiles(q) for n, q in EMPIRICAL_LENGTHS[spec.name].items()}
    run = simulate(
        spec,
        e.arm,
        e.layout(agents_of(spec)),
        costs,
        lengths,
        EMPIRICAL_PROMPTS[spec.name],
        sizes.steps,
        sizes.episodes,
        sizes.micro_batches,
    )
    return run.step_s


def role(arm: str, calibration: bool) -> str:
    if not calibration:
        return "day reference" if arm == "flex" or arm in TWINS else "held out, ratio"
    if arm in FITTED:
        return "fitted"
    return f"twin of {TWINS[arm]}" if arm in TWINS else "held out"


def validate_file(
    e2e_json: Path, costs: Costs, calibration: bool, suffix: str = ""
) -> dict[str, dict[str, Any]]:
    """Per `workload/arm` of one e2e JSON: measured step_s (median over repeats, and each
    repeat), the predicted one, the relative error, whether the prediction lies within the
    repeats' spread, and the arm's `role` (module docstring)."""
    res = json.loads(e2e_json.read_text())
    specs, sizes = e2e_specs(e2e_json)
    out: dict[str, dict[str, Any]] = {}
    for wl, spec in specs.items():
        for arm, m in res["workloads"][wl]["arms"].items():
            if arm not in E2E_ARMS:
                continue
            own = Sizes(
                sizes.steps, sizes.episodes, int(m.get("micro_batches", sizes.micro_batches))
            )
            predicted = predict(spec, arm, own, costs)
            measured = float(m["step_s"])
            repeats = [float(x) for x in m.get("step_s_repeats", [measured])]
            out[f"{wl}/{arm}{suffix}"] = {
                "measured_s": measured,
                "measured_repeats": repeats,
                "predicted_s": round(predicted, 3),
                "error": round((predicted - measured) / measured, 4),
                "within_repeats": min(repeats) <= predicted <= max(repeats),
                "role": role(arm, calibration),
                "micro_batches": own.micro_batches,
                "date": res.get("date"),
            }
        ref = out.get(f"{wl}/flex{suffix}")
        for arm in res["workloads"][wl]["arms"]:
            x = out.get(f"{wl}/{arm}{suffix}")
            if ref is None or x is None or x["role"] != "held out, ratio":
                continue
            predicted = x["predicted_s"] / ref["predicted_s"]
            measured = x["measured_s"] / ref["measured_s"]
            x["ratio_to_flex"] = {"predicted": round(predicted, 3), "measured": round(measured, 3)}
            x["ratio_error"] = round(predicted / measured - 1, 4)
    return out


def validate(
    e2e_json: Path, costs: Costs | None = None, heldout: tuple[Path, ...] = ()
) -> dict[str, dict[str, Any]]:
    """The calibration run's arms, then every replayable arm of the `heldout` files (keys
    suffixed with the file's name)."""
    costs = costs or profile("cpu-here")
    out = validate_file(e2e_json, costs, calibration=True)
    for path in heldout:
        if path.is_file():
            out |= validate_file(path, costs, calibration=False, suffix=f" ({path.stem})")
    return out


def summary(v: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How many checks are real: the held-out arms, their mean |error| and largest."""
    by: dict[str, list[float]] = {}
    for x in v.values():
        key = "twin" if x["role"].startswith("twin") else x["role"]
        by.setdefault(key, []).append(x.get("ratio_error", x["error"]))
    out: dict[str, Any] = {k: len(e) for k, e in by.items()}
    for role, name in (("held out", "heldout"), ("held out, ratio", "heldout_ratio")):
        if errors := by.get(role, []):
            out[f"{name}_mean_abs_error"] = round(sum(abs(e) for e in errors) / len(errors), 4)
            out[f"{name}_max_abs_error"] = round(max(abs(e) for e in errors), 4)
    return out
