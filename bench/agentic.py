"""Agentic episodes: early stop, flex over sync, and whether the repair loop learns.

    python -m bench.agentic [--small] [--steps N] [--episodes N] [--heldout N]
                            [--model DIR] [--seed S] [--json PATH] [--scheduler ADDRESS]

Every arm trains the warm-started `code-repair` team (coder → run_tests → reviewer, up to
3 rounds) for the same steps, with the same seed, on a fresh local cluster laid out as a
run with no cluster settings lays it out (`flows.cluster.layout`; on 2 cores a rollout worker
per agent and a training worker, except in async mode):

- `early`: the workload as it is (flex; the reviewer's `yes` stops the loop; the coder's
  credit `episode`).
- `forced`: every round runs (`until` a condition that never holds): what the episodes
  cost without early stop.
- `sync`: `early` in sync mode (a barrier on the whole step).
- `crbc`: `early` with the coder's credit `crbc` (Cross-Rollout Bellman Closure).

Per arm: `step_s` (median step time over steps >= 1; step 0 loads models), `rounds_taken`
(of the coder's round-2 and round-3 invocations, the fraction that ran),
`team_reward_last3`, the consistency audit's `violations`, and for `early` and `crbc` the
held-out outcome of the final models (each agent sampling as in training, `--heldout`
tasks of the held-out split): `final_reward` (per rollout, the reward of the last round it
took), `solved` (the fraction whose last round passed every test) and `repaired`.

Keys: `early_stop_step_time_ratio` (`early` over `forced`), `flex_over_sync_agentic`
(`sync` over `early`), `heldout_pass_rate_before` (the warm-started models),
`heldout_pass_rate_after` (`early`'s), `heldout_repair_rate_before` / `_after` (of the
rollouts whose first round failed a test, the fraction the repair rounds fixed: what the
repair turn itself learned), `crbc_vs_episode_reward_delta` (held-out `final_reward` of
`crbc` minus `early`'s), `crbc_vs_episode_solved_delta` and
`crbc_vs_episode_repaired_delta`. Per arm also the machine's busy cores and the step's work
in core-seconds (`bench.cores`), and `bound_flex_over_sync_agentic`: sync's step over the
fastest step any schedule doing `early`'s work could have on this machine's cores.
`--small` (the test suite): 2 steps × 2 episodes, 4 held-out tasks, a 2-step warm start,
one shared cluster (`--scheduler`: a running one's address).
"""

from __future__ import annotations

import argparse
import platform
from contextlib import ExitStack
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench.common import cpu_model, train_run, write_results
from bench.cores import CoreSampler
from bench.e2e import bound_over, steady_state
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api
from storage.schema import SKIPPED
from storage.store import MEGStore
from workloads import BUILTIN

ARMS = ("early", "forced", "sync", "crbc")
NEVER = {"node": "review", "fn": "matches", "params": {"pattern": "(?!)"}}


def config_copy(arm: str, model: str, work: Path, steps: int, episodes: int, seed: int = 0) -> Path:
    """code-repair on `model`, changed as `arm` says (module docstring), run seed `seed`."""
    data = yaml.safe_load(BUILTIN["code-repair"].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
    data["plugins"] = ["workloads.code_repair"]
    data["run"] = {"steps": steps, "episodes_per_step": episodes, "micro_batches": 2}
    data["run"]["seed"] = seed
    data["run"]["mode"] = "sync" if arm == "sync" else "flex"
    if arm == "forced":
        data["loops"]["repair"]["until"] = [NEVER]
    if arm == "crbc":
        data["agents"]["coder"]["loss"]["credit"] = "crbc"
    path = work / f"code-repair-{arm}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rounds_taken(summary: dict[str, Any]) -> float:
    """Of the coder's rounds after the first, the fraction that ran (from the store)."""
    store = MEGStore.open(summary["store_url"], summary["run_id"], create=False)
    rows = store.table("coder").read()
    later = np.isin(rows.node, ["code@2", "code@3"])
    return round(float((rows.finish_reason[later] != SKIPPED).mean()), 4) if later.any() else 0.0


def heldout(cfg: Path, checkpoint: Path | None, tasks: int) -> dict[str, float]:
    """The loop's held-out outcome: the run's final models, or the config's (`None`)."""
    from flows.evaluate import EvalParams, evaluate

    p = EvalParams(
        config=str(cfg),
        checkpoint=None if checkpoint is None else str(checkpoint),
        base=checkpoint is None,
        sampling="policy",
        limit=tasks,
    )
    return evaluate(p)["loops"]["repair.code"]


def run_arm(
    arm: str, cfg: Path, run_dir: Path, scheduler: str | None, tasks: int, cores: CoreSampler
) -> dict[str, Any]:
    """One arm's run (on the cluster at `scheduler`, or with none given on a cluster of its
    own that the run lays out) and its numbers; the held-out outcome for `early`/`crbc`."""
    out = train_run(cfg, run_dir, scheduler)
    st = steady_state(out, run_dir, None, cores)
    rewards = [r["team_reward"] for r in out["per_step"]]
    result: dict[str, Any] = {
        "step_s": st["step_s"],
        **{k: st[k] for k in ("workers", "cores_busy", "work_core_s") if k in st},
        "rounds_taken": rounds_taken(out),
        "team_reward_last3": round(float(np.mean(rewards[-3:])), 4),
        "violations": st["violations"],
    }
    if arm in ("early", "crbc"):
        result["heldout"] = heldout(cfg, run_dir, tasks)
    return result


def ratios(
    arms: dict[str, dict[str, Any]], before: dict[str, float], cpus: int
) -> dict[str, float]:
    """The bench's keys; `bound_flex_over_sync_agentic`: sync's step over the fastest step
    any schedule doing `early`'s work a step could have on `cpus` cores (bench.cores)."""
    early, forced, sync, crbc = (arms[a] for a in ARMS)
    bound = bound_over(arms, "early", "sync", cpus)
    return ({} if bound is None else {"bound_flex_over_sync_agentic": bound}) | {
        "early_stop_step_time_ratio": round(early["step_s"] / forced["step_s"], 4),
        "flex_over_sync_agentic": round(sync["step_s"] / early["step_s"], 4),
        "heldout_pass_rate_before": before["solved"],
        "heldout_pass_rate_after": early["heldout"]["solved"],
        "heldout_repair_rate_before": before["repaired"],
        "heldout_repair_rate_after": early["heldout"]["repaired"],
        "crbc_vs_episode_reward_delta": round(
            crbc["heldout"]["final_reward"] - early["heldout"]["final_reward"], 4
        ),
        "crbc_vs_episode_solved_delta": round(
            crbc["heldout"]["solved"] - early["heldout"]["solved"], 4
        ),
        "crbc_vs_episode_repaired_delta": round(
            crbc["heldout"]["repaired"] - early["heldout"]["repaired"], 4
        ),
    }


def build_model(work: Path, warm_steps: int | None) -> str:
    """A seeded tiny model warm-started on code-repair (its preset steps unless given)."""
    from flows.cli.main import main as cli

    model = work / "model-code-repair"
    args = ["tiny-model", str(model), "--warm-start", "code-repair"]
    if cli(args + ([] if warm_steps is None else ["--warm-steps", str(warm_steps)])) != 0:
        raise SystemExit("building the code-repair model failed")
    return str(model)


def run(
    steps: int,
    episodes: int,
    tasks: int,
    work: Path,
    model: str | None,
    shared: bool,
    warm_steps: int | None = None,
    seed: int = 0,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """Every arm in turn, each on a cluster of its own, or all on one (`shared`: the one at
    `scheduler`, or one started here)."""
    results: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpu": cpu_model(),
        "cpus": psutil.cpu_count(),
        "steps": steps,
        "episodes_per_step": episodes,
        "heldout_tasks": tasks,
        "seed": seed,
    }
    with prefect_api(), ExitStack() as stack, CoreSampler() as cores:
        model = model or build_model(work, warm_steps)
        if shared and scheduler is None:
            scheduler = stack.enter_context(dask_cluster(ClusterConfig())).address
        address = scheduler if shared else None
        arms = {}
        for arm in ARMS:
            cfg = config_copy(arm, model, work, steps, episodes, seed)
            arms[arm] = run_arm(arm, cfg, work / f"run-{arm}", address, tasks, cores)
            print(f"{arm}: {arms[arm]}")
        before = heldout(config_copy("early", model, work, steps, episodes, seed), None, tasks)
    results["arms"] = arms
    results["heldout_before"] = before
    return results | ratios(arms, before, results["cpus"] or 1)


def table(results: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"code-repair: {results['steps']} steps × {results['episodes_per_step']}")
    cols = ("arm", "step s", "rounds taken", "train reward", "held-out final", "solved", "repaired")
    for col in cols:
        t.add_column(col, justify="left" if col == "arm" else "right")
    for arm, r in results["arms"].items():
        h = r.get("heldout", {})
        t.add_row(
            arm,
            f"{r['step_s']:.2f}",
            f"{r['rounds_taken']:.2f}",
            f"{r['team_reward_last3']:.3f}",
            f"{h['final_reward']:.3f}" if h else "-",
            f"{h['solved']:.3f}" if h else "-",
            f"{h['repaired']:.3f} of {int(h['first_failed'])}" if h else "-",
        )
    return t


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import tempfile

    from rich.console import Console

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="2 steps × 2 episodes, shared cluster")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--heldout", type=int, default=64, help="held-out tasks evaluated")
    p.add_argument("--model", help="a warm-started code-repair model (default: build one)")
    p.add_argument("--seed", type=int, default=0, help="run seed (data order and sampling)")
    p.add_argument("--json", default="bench/results/agentic.json")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="with --small: the arms on the running Dask cluster at ADDRESS (default: start one)",
    )
    a = p.parse_args(argv)
    if a.scheduler is not None and not a.small:
        p.error("--scheduler is for --small (a full run gives every arm a cluster of its own)")
    steps, episodes, tasks = (2, 2, 4) if a.small else (a.steps, a.episodes, a.heldout)
    with tempfile.TemporaryDirectory(prefix="flexmarl-agentic-") as tmp:
        warm = 2 if a.small else None  # --small checks keys, not learning
        res = run(steps, episodes, tasks, Path(tmp), a.model, a.small, warm, a.seed, a.scheduler)
    Console().print(table(res))
    keys = [k for k in res if k.endswith(("_ratio", "_agentic", "_before", "_after", "_delta"))]
    for k in keys:
        print(f"{k}: {res[k]}")
    write_results(res, a.json)
    return res


if __name__ == "__main__":
    main()
