"""End-to-end benchmark: the same workload in sync, flex, flex without balancing, async(η=1)
and flex on plain Dask futures, side by side in one run, on one cluster.

    python -m bench.e2e [--small] [--json PATH] [--workloads fanout,math-chain]
                        [--steps N] [--episodes N] [--model DIR] [--repeats R]
                        [--arms A,B] [--scheduler ADDRESS]

Arms run with the default hybrid executor (plain Dask futures per node, one Prefect task
run per step) unless named: `flex-dask` has no Prefect task at all, `*-prefect-per-node`
makes every node of every micro-batch a Prefect task run.

Two multi-agent baselines run beside flex: `sync` (the stage-synchronous MAS-RL trainer: one
barrier per step, rollout and training on their own workers) and `marti-like` (MARTI's
schedule: the same barrier, but every agent has one worker of its own on which its rollout
and its training are colocated, so the agents train concurrently; it runs on a cluster of
one colocated worker per agent, `PER_AGENT`, and, as MARTI generates an agent's whole
rollout batch at once, in one micro-batch a step where every other arm runs
`MICRO_BATCHES`; the JSON records each arm's `micro_batches`). Each arm is a real `train` flow
(real Prefect server, Dask cluster, vLLM, training). Step 0 of every arm loads models and is
excluded: `step_s` is the median completion interval of
steps ≥ 1; `utilization` is busy task time over (steady-state wall × workers). Reported
ratios: `speedup_flex_vs_sync` (sync step_s / flex step_s), `balance_gain` (flex without
balancing / flex), `prefect_overhead` (1 − flex-on-Dask step_s / flex step_s: what the
default's per-step Prefect task runs cost over plain Dask futures) and
`prefect_per_node_overhead` (the same for a Prefect task run per node).

`flex-auto` and `sync-auto` run each time on a cluster of their own, with no cluster
settings: the layout `flexmarl train` chooses for the MEG and the machine
(`flows.cluster.layout`; on 2 cores a rollout worker per agent up to one per core, and a
training worker), against the shared two-worker cluster of `flex` and `sync`
(`layout_gain_flex`, `layout_gain_sync`); `flex-auto-nobalance` is flex-auto without the
balancer (`balance_gain_auto`: there a team can have more hosts than agents).

Every arm also reports the machine's busy cores over its window (`cores_busy`, machine-wide
CPU time: `bench.cores`) and its work a step in core-seconds (`work_core_s`).
`bound_<arm>_over_marti` is marti-like's step over the fastest step any schedule doing
`<arm>`'s work could have on this machine's cores: no schedule beats marti-like by more
without doing less work.

`--repeats R` runs the whole list of arms R times, interleaved (arm order A B C, A B C, ...),
and reports per arm the median over repeats: machine-wide slowdowns (a shared VM) then hit
every arm alike instead of whichever arm happened to run at the time. With R ≥ 2 every
ratio and bound also comes per repeat (`<ratio>_spread`: repeats, min, max), each repeat's
ratio taken between the two arms' runs of that repeat.

`--scheduler ADDRESS` runs the arms of the shared cluster on the running cluster at ADDRESS
(1 rollout + 1 training worker, as `ClusterConfig()` starts it) instead of starting one:
the test suite's session cluster.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
from contextlib import ExitStack
from datetime import date
from pathlib import Path
from typing import Any

import psutil
import yaml
from rich.console import Console
from rich.table import Table

from bench.common import cpu_model, train_run, write_results
from bench.cores import CoreSampler
from bench.packed import pack
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api
from workloads import BUILTIN

ARMS: dict[str, dict[str, Any]] = {
    "sync": {"mode": "sync"},
    "flex": {"mode": "flex"},
    "flex-nobalance": {"mode": "flex", "balance": False},
    "async-1": {"mode": "async", "staleness": 1},
    "flex-dask": {"mode": "flex", "executor": "dask"},
    "flex-prefect-per-node": {"mode": "flex", "executor": "prefect"},
    "sync-prefect-per-node": {"mode": "sync", "executor": "prefect"},
    # MARTI generates an agent's whole rollout batch at once: one micro-batch a step
    "marti-like": {"mode": "sync", "balance": False, "cluster": "per-agent", "micro_batches": 1},
    "flex-elastic": {"mode": "flex", "elastic": True},
    "flex-auto": {"mode": "flex", "cluster": "auto"},
    "sync-auto": {"mode": "sync", "cluster": "auto"},
    "flex-auto-nobalance": {"mode": "flex", "balance": False, "cluster": "auto"},
}
MICRO_BATCHES = 2  # a step's micro-batches in every arm that names no `micro_batches` of its own
PER_AGENT = "per-agent"
BOUND_ARMS = ("flex", "flex-auto")  # arms whose bound over marti-like is reported
AUTO = "auto"  # no cluster given: the run starts the one flows.cluster.layout chooses


def per_agent_cluster(n_agents: int) -> ClusterConfig:
    """MARTI's layout: one colocated worker per agent. With balancing off the balancer's
    static split gives agent i the rollout engine of worker i, and the pipeline's sticky
    training placement gives it training worker i: both are the same worker (the two role
    lists are the same sorted names)."""
    return ClusterConfig(colocate=True, rollout_workers=n_agents)


def micro_batches_of(arm: str) -> int:
    """The micro-batches a step of `arm` runs in (`MICRO_BATCHES` unless the arm says)."""
    return int(ARMS[arm].get("micro_batches", MICRO_BATCHES))


def config_copy(
    workload: str,
    model: str,
    out: Path,
    steps: int,
    episodes: int,
    micro_batches: int = MICRO_BATCHES,
) -> Path:
    data = yaml.safe_load(BUILTIN[workload].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
    data["run"] = {
        **data.get("run", {}),
        "steps": steps,
        "episodes_per_step": episodes,
        "micro_batches": micro_batches,
    }
    path = out / f"{workload}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


ROLE_PHASES = {"rollout": ("generate", "score"), "train": ("train_micro_batch", "optimizer_step")}


def idle_ratio(
    tasks: list[dict[str, Any]], phases: tuple[str, ...], begin: float, end: float, workers: int
) -> float:
    """1 − (time the role's tasks ran, clipped to [begin, end]) / (window × its workers): the
    rollout and trainer idle ratios verl's fully-async mode reports. On a colocated worker
    the time it spends on the other role counts as idle for this one."""
    busy = sum(
        max(0.0, min(t["end"], end) - max(t["start"], begin)) for t in tasks if t["phase"] in phases
    )
    return round(1 - busy / ((end - begin) * workers), 4) if end > begin else 0.0


def timeline_roles(tasks: list[dict[str, Any]]) -> tuple[int, int]:
    """How many workers ran rollout tasks and how many training tasks (a run on a cluster of
    its own, whose layout the run chose)."""
    rollout, train = ({t["worker"] for t in tasks if t["phase"] in p} for p in ROLE_PHASES.values())
    return len(rollout), len(train)


def steady_state(
    summary: dict[str, Any],
    run_dir: Path,
    roles: tuple[int, int] | None = (1, 1),
    cores: CoreSampler | None = None,
) -> dict[str, float]:
    """step_s over steps ≥ 1 (step 0 pays model loading) and utilization over the same
    window: from the end of step 0 to the end of the run, each task clipped to the window (a
    flex or async step-1 task may start while step 0 still trains). `roles`: how many
    workers roll out and how many train (a colocated worker counts in both; None: read from
    the timeline). `cores`: the machine's busy cores over the window (`bench.cores`), and
    the step's work in core-seconds."""
    rows = [r for r in summary["per_step"] if r["step"] >= 1]
    tasks = json.loads((run_dir / "timeline.json").read_text())
    begin = max(t["end"] for t in tasks if t["phase"] == "optimizer_step" and t["step"] == 0)
    end = max(t["end"] for t in tasks)
    busy = sum(max(0.0, min(t["end"], end) - max(t["start"], begin)) for t in tasks)
    wall = end - begin
    roles = roles or timeline_roles(tasks)
    step_s = round(statistics.median(r["wall_s"] for r in rows), 3)
    used = cores.busy(begin, end) if cores is not None else None
    machine = (
        {}
        if used is None
        else {"cores_busy": round(used, 3), "work_core_s": round(used * step_s, 3)}
    )
    return {
        **machine,
        "workers": list(roles),
        "step_s": step_s,
        "utilization": round(busy / (wall * summary["workers"]), 4) if wall > 0 else 0.0,
        "rollout_idle": idle_ratio(tasks, ROLE_PHASES["rollout"], begin, end, roles[0]),
        "trainer_idle": idle_ratio(tasks, ROLE_PHASES["train"], begin, end, roles[1]),
        "wall_s": round(summary["wall_s"], 2),
        "violations": summary["consistency"]["violations"],
        "team_reward_last": summary["per_step"][-1]["team_reward"],
    }


MEDIANS = (
    "step_s",
    "utilization",
    "rollout_idle",
    "trainer_idle",
    "wall_s",
    "team_reward_last",
    "cores_busy",
    "work_core_s",
)


def median_of(runs: list[dict[str, float]]) -> dict[str, Any]:
    """One arm over its repeats: medians of the timings, the worst consistency verdict."""
    out: dict[str, Any] = {
        k: round(statistics.median(r[k] for r in runs), 4) for k in MEDIANS if k in runs[0]
    }
    out["violations"] = max(r["violations"] for r in runs)
    if "workers" in runs[0]:
        out["workers"] = runs[0]["workers"]  # the same layout in every repeat
    if len(runs) > 1:
        out["step_s_repeats"] = [r["step_s"] for r in runs]
        if "work_core_s" in runs[0]:
            out["work_core_s_repeats"] = [r["work_core_s"] for r in runs]
    return out


def n_agents(cfg: Path) -> int:
    """Agents that own at least one node of the config (the ones that get a worker)."""
    nodes = yaml.safe_load(cfg.read_text())["nodes"].values()
    return len({n["agent"] for n in nodes})


def kept_in(json_path: Path) -> tuple[Path, Path]:
    """Where a run of `--json DIR/NAME.json` keeps its runs and its timeline pictures:
    `DIR/NAME_runs/` for both, except for `e2e.json`, the reference run, whose runs are
    `DIR/e2e_runs/`, packed into `DIR/e2e_runs.json` (`bench.packed`: what `bench.sim`
    calibrates against, the one copy git keeps) and whose pictures are `DIR/timeline_*.png`
    (the README's). So a side measurement written to another name never overwrites the
    simulator's inputs."""
    runs = json_path.parent / f"{json_path.stem}_runs"
    return runs, json_path.parent if json_path.stem == "e2e" else runs


def keep_run(run_dir: Path, runs: Path, name: str) -> None:
    """A run's timeline and summary beside the JSON (what `bench.sim` calibrates from)."""
    runs.mkdir(parents=True, exist_ok=True)
    for part in ("timeline", "summary"):
        shutil.copy(run_dir / f"{part}.json", runs / f"{name}.{part}.json")


# ratio → (numerator arm, denominator arm, digits): > 1 means the second is faster, for
# `*_overhead` 1 − numerator / denominator. A ratio is reported when both arms ran (`--arms`).
RATIOS: dict[str, tuple[str, str, int]] = {
    "speedup_flex_vs_sync": ("sync", "flex", 3),
    "speedup_flex_vs_marti": ("marti-like", "flex", 3),
    "balance_gain": ("flex-nobalance", "flex", 3),
    "async_gain": ("flex", "async-1", 3),
    "elastic_gain": ("flex", "flex-elastic", 3),
    "layout_gain_flex": ("flex", "flex-auto", 3),
    "layout_gain_sync": ("sync", "sync-auto", 3),
    "speedup_flex_auto_vs_marti": ("marti-like", "flex-auto", 3),
    "speedup_flex_auto_vs_sync_auto": ("sync-auto", "flex-auto", 3),
    "balance_gain_auto": ("flex-auto-nobalance", "flex-auto", 3),
    "prefect_overhead": ("flex-dask", "flex", 4),
    "prefect_per_node_overhead": ("flex-dask", "flex-prefect-per-node", 4),
    "speedup_flex_vs_sync_per_node": ("sync-prefect-per-node", "flex-prefect-per-node", 3),
}


def ratios(arms: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The headline ratios of one workload (> 1: flex is faster), over the arms that ran."""
    out: dict[str, float] = {}
    for name, (num, den, digits) in RATIOS.items():
        if num in arms and den in arms:
            r = arms[num]["step_s"] / arms[den]["step_s"]
            out[name] = round(1 - r if name.endswith("_overhead") else r, digits)
    if "flex" in arms:
        out["idle_share_flex"] = round(1 - arms["flex"]["utilization"], 4)
    return out


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    """Per-repeat values with their range: {"repeats": [...], "min": .., "max": ..}."""
    vals = [round(v, digits) for v in values]
    return {"repeats": vals, "min": min(vals), "max": max(vals)}


def ratio_spreads(runs: dict[str, list[dict[str, Any]]], cpus: int) -> dict[str, Any]:
    """Each headline ratio and bound per repeat (arms interleave, so repeat r of one arm ran
    beside repeat r of the other): `<ratio>_spread` = {repeats, min, max}. With one repeat
    there is no spread to report."""
    out: dict[str, Any] = {}
    n = min((len(rs) for rs in runs.values()), default=0)
    if n < 2:
        return out
    for name, (num, den, digits) in RATIOS.items():
        if num in runs and den in runs:
            per = [runs[num][r]["step_s"] / runs[den][r]["step_s"] for r in range(n)]
            per = [1 - x for x in per] if name.endswith("_overhead") else per
            out[f"{name}_spread"] = spread(per, digits)
    for arm in BOUND_ARMS:
        if arm in runs and "marti-like" in runs and "work_core_s" in runs[arm][0]:
            marti, work = runs["marti-like"], runs[arm]
            per = [marti[r]["step_s"] * cpus / work[r]["work_core_s"] for r in range(n)]
            out[f"bound_{arm}_over_marti_spread"] = spread(per)
    return out


def bound_over(arms: dict[str, dict[str, Any]], arm: str, baseline: str, cpus: int) -> float | None:
    """The most any schedule doing `arm`'s work a step could beat `baseline` by on `cpus`
    cores: baseline step / (arm's core-seconds a step / cpus)."""
    if arm not in arms or baseline not in arms or "work_core_s" not in arms[arm]:
        return None
    return round(arms[baseline]["step_s"] * cpus / arms[arm]["work_core_s"], 3)


def run(
    workloads: list[str],
    model: str,
    steps: int,
    episodes: int,
    work: Path,
    repeats: int = 1,
    keep: tuple[Path, Path] | None = None,
    arms: tuple[str, ...] = tuple(ARMS),
    scheduler: str | None = None,
) -> dict[str, Any]:
    """All arms on every workload; `keep`: where to keep every run's timeline and summary,
    and the sync and flex timeline pictures (`kept_in`). Arms share one cluster (1 rollout + 1
    training worker; the one at `scheduler`, or one started here) except `marti-like`, which
    gets one colocated worker per agent, and the `*-auto` arms, each run on a cluster of its
    own that the run lays out itself."""
    cpus = psutil.cpu_count() or 1
    results: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": cpus,
        "cpu": cpu_model(),
        "steps": steps,
        "episodes_per_step": episodes,
        "repeats": repeats,
        "workloads": {},
    }
    with prefect_api(), ExitStack() as stack:
        if scheduler is None:
            scheduler = stack.enter_context(dask_cluster(ClusterConfig())).address
        cores = stack.enter_context(CoreSampler())
        for wl in workloads:
            cfg = config_copy(wl, model, work, steps, episodes)
            n = n_agents(cfg)
            runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
            with dask_cluster(per_agent_cluster(n)) as per_agent:
                for r in range(repeats):
                    for arm in arms:
                        kw = ARMS[arm]
                        params = {k: v for k, v in kw.items() if k != "cluster"}  # micro_batches
                        # included: a run setting overriding the config's MICRO_BATCHES
                        address, roles = {
                            PER_AGENT: (per_agent.address, (n, n)),
                            AUTO: (None, None),
                        }.get(kw.get("cluster", ""), (scheduler, (1, 1)))
                        run_dir = work / f"{wl}-{arm}-{r}"
                        out = train_run(cfg, run_dir, address, **params)
                        runs[arm].append(steady_state(out, run_dir, roles, cores))
                        if keep is not None:
                            keep_run(run_dir, keep[0], f"{wl}-{arm}-{r}")
                            if arm in ("sync", "flex"):
                                png = keep[1] / f"timeline_{wl}_{arm}.png"
                                shutil.copy(run_dir / "timeline.png", png)
            measured = {
                arm: {**median_of(rs), "micro_batches": micro_batches_of(arm)}
                for arm, rs in runs.items()
            }
            bounds = {
                f"bound_{arm}_over_marti": bound_over(measured, arm, "marti-like", cpus)
                for arm in BOUND_ARMS
            }
            results["workloads"][wl] = {
                "agents": n,
                "arms": measured,
                **ratios(measured),
                **{k: v for k, v in bounds.items() if v is not None},
                **ratio_spreads(runs, cpus),
            }
    return results


def render(results: dict[str, Any]) -> None:
    con = Console()
    for wl, r in results["workloads"].items():
        t = Table(
            title=f"{wl}: {results['steps']} steps × {results['episodes_per_step']} "
            f"episodes, median step time over steps ≥ 1 (median of {results['repeats']} runs)"
        )
        cols = ("arm", "workers", "step_s", "utilization", "rollout idle", "trainer idle")
        for col in (*cols, "cores busy", "core-s a step", "violations", "team reward (last)"):
            t.add_column(col, justify="left" if col == "arm" else "right")
        for arm, m in r["arms"].items():
            t.add_row(
                arm,
                "{} + {}".format(*m["workers"]) if "workers" in m else "-",
                f"{m['step_s']:.2f}",
                f"{m['utilization']:.2f}",
                f"{m['rollout_idle']:.2f}",
                f"{m['trainer_idle']:.2f}",
                f"{m['cores_busy']:.2f}" if "cores_busy" in m else "-",
                f"{m['work_core_s']:.2f}" if "work_core_s" in m else "-",
                str(m["violations"]),
                f"{m['team_reward_last']:.3f}",
            )
        con.print(t)
        keys = (*RATIOS, "idle_share_flex", *(f"bound_{arm}_over_marti" for arm in BOUND_ARMS))
        con.print(
            ", ".join(f"{k} {r[k]}{spread_text(r.get(f'{k}_spread'))}" for k in keys if k in r)
        )


def spread_text(s: dict[str, Any] | None) -> str:
    """' (min–max over repeats)', or nothing with one repeat."""
    return "" if s is None else f" ({s['min']}–{s['max']})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workloads", default="fanout,math-chain")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--model", default="models/tiny-math", help="HF model dir for every agent")
    ap.add_argument("--repeats", type=int, default=1, help="run every arm R times, interleaved")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"a subset of {', '.join(ARMS)}")
    ap.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="the shared arms on the running Dask cluster at ADDRESS (default: start one)",
    )
    a = ap.parse_args(argv)
    unknown = set(a.arms.split(",")) - set(ARMS)
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(sorted(unknown))}; known: {', '.join(ARMS)}")
    steps = a.steps or (2 if a.small else 6)
    episodes = a.episodes or (2 if a.small else 32)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if a.small and not Path(model).is_dir():
            from workloads.tiny_model import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny"))
        results = run(
            a.workloads.split(","),
            model,
            steps,
            episodes,
            Path(tmp),
            a.repeats,
            kept_in(a.json) if a.json else None,
            tuple(a.arms.split(",")),
            a.scheduler,
        )
    render(results)
    if a.json:
        write_results(results, a.json)
        runs, _ = kept_in(a.json)
        if a.json.stem == "e2e" and runs.is_dir():  # the reference run: one file in git
            print(f"packed {pack(runs, runs.with_suffix('.json'))}")
    return results


if __name__ == "__main__":
    main()
