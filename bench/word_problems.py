"""Does the word-problems team learn? Held-out team reward before and after RL.

    python -m bench.word_problems [--warm-steps N] [--steps S] [--episodes E] [--repeats R]
                                  [--eval-limit N] [--seeds 0,1] [--json PATH]
                                  [--scheduler ADDRESS]

Defaults: the workload's warm-start preset and the MEG's own run (60 steps × 32 episodes),
i.e. exactly what `make word-problems` trains.

For each seed: build a tiny model (`workloads.tiny_model`, seeded) and warm-start it on the
workload's format (supervised, on reference episodes of the training split); evaluate it on
the 128 held-out problems, greedily and with the agents' own sampling (`--repeats`
episodes per problem: what RL optimises, with less noise than one greedy answer); train
the built-in `word-problems` MEG (solver → verifier → reviser, math-verify rewards) on the
default local cluster; evaluate the trained agents the same two ways. The held-out
problems are never trained on (the dataset's seeded split). `--scheduler` trains on a running
Dask cluster instead (`flexmarl train --scheduler`: the test suite's session cluster).

Keys per seed: `before` / `after` → `greedy` / `sampled` → `team` (the reviser's reward),
`agents`; `delta_team` per evaluation; `mean_delta_team` over seeds. Results go to
`bench/results/word_problems.json` by default.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from bench.common import write_results
from flows.cli.main import main as cli
from flows.cluster.start import prefect_api
from flows.evaluate import EvalParams, evaluate
from workloads import BUILTIN
from workloads.warm_start import PRESET_STEPS

WORKLOAD = "word-problems"


def config_copy(model: str, out: Path, steps: int | None, episodes: int | None = None) -> Path:
    """The built-in MEG with every agent on `model` (and `steps` RL steps of `episodes`
    episodes, if given)."""
    data = yaml.safe_load(BUILTIN[WORKLOAD].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
    if steps is not None:
        data["run"]["steps"] = steps
    if episodes is not None:
        data["run"]["episodes_per_step"] = episodes
    path = out / f"{WORKLOAD}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _scores(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "team": result["team_reward"],
        "agents": result["agent_reward"],
        "tasks": result["tasks"],
    }


@dataclass(frozen=True)
class Setup:
    warm_steps: int
    steps: int | None = None  # None: the MEG's
    episodes: int | None = None  # None: the MEG's
    eval_limit: int | None = None  # None: every held-out problem
    repeats: int = 4  # sampled episodes per held-out problem
    scheduler: str | None = None  # None: the cluster `flexmarl train` lays out and starts


def run_seed(seed: int, setup: Setup, work: Path) -> dict[str, Any]:
    model = work / f"model-{seed}"
    args = ["tiny-model", str(model), "--seed", str(seed), "--warm-start", WORKLOAD]
    if cli([*args, "--warm-steps", str(setup.warm_steps)]) != 0:
        raise SystemExit(f"building the warm-started model of seed {seed} failed")
    cfg = config_copy(str(model), work, setup.steps, setup.episodes)

    def both(**source: Any) -> dict[str, Any]:
        common = dict(config=str(cfg), limit=setup.eval_limit, **source)
        return {
            "greedy": _scores(evaluate(EvalParams(**common))),
            "sampled": _scores(
                evaluate(EvalParams(**common, sampling="policy", repeats=setup.repeats))
            ),
        }

    before = both(base=True)
    run_dir = work / f"run-{seed}"
    summary = work / f"summary-{seed}.json"
    train = ["train", str(cfg), "--run-dir", str(run_dir), "--summary-json", str(summary)]
    train += [] if setup.scheduler is None else ["--scheduler", setup.scheduler]
    if cli(train) != 0:
        raise SystemExit(f"training seed {seed} failed")
    after = both(checkpoint=str(run_dir))
    trained = json.loads(summary.read_text())
    return {
        "seed": seed,
        "before": before,
        "after": after,
        "delta_team": {
            how: round(after[how]["team"] - before[how]["team"], 4) for how in ("greedy", "sampled")
        },
        "held_out_tasks": after["greedy"]["tasks"],
        "train_wall_s": trained["wall_s"],
        "sampled_team_reward_first_last": [
            trained["per_step"][0]["team_reward"],
            trained["per_step"][-1]["team_reward"],
        ],
        "violations": trained["consistency"]["violations"],
    }


def run(seeds: list[int], setup: Setup, work: Path) -> dict[str, Any]:
    meg_run = yaml.safe_load(BUILTIN[WORKLOAD].read_text())["run"]
    results: dict[str, Any] = {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "workload": WORKLOAD,
        "warm_steps": setup.warm_steps,
        "rl_steps": setup.steps or meg_run["steps"],
        "episodes_per_step": setup.episodes or meg_run["episodes_per_step"],
        "repeats": setup.repeats,
    }
    with prefect_api():
        results["seeds"] = [run_seed(s, setup, work) for s in seeds]
    results["mean_delta_team"] = {
        how: round(statistics.mean(r["delta_team"][how] for r in results["seeds"]), 4)
        for how in ("greedy", "sampled")
    }
    return results


def render(results: dict[str, Any]) -> None:
    t = Table(
        title=f"word-problems · {results['seeds'][0]['held_out_tasks']} held-out problems · "
        f"{results['warm_steps']} warm-start steps, {results['rl_steps']} RL steps"
    )
    for col in ("seed", "evaluation", "who", "before", "after", "Δ"):
        t.add_column(col, justify="left" if col in ("evaluation", "who") else "right")
    for r in results["seeds"]:
        for how in ("greedy", "sampled"):
            b, a = r["before"][how], r["after"][how]
            label = how if how == "greedy" else f"sampled ×{results['repeats']}"
            rows = [("team (reviser)", b["team"], a["team"])]
            rows += [(who, v, a["agents"][who]) for who, v in b["agents"].items()]
            for who, vb, va in rows:
                t.add_row(str(r["seed"]), label, who, f"{vb:.3f}", f"{va:.3f}", f"{va - vb:+.3f}")
    Console().print(t)
    d = results["mean_delta_team"]
    print(f"mean team Δ over seeds: greedy {d['greedy']:+.3f}, sampled {d['sampled']:+.3f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warm-steps", type=int, default=PRESET_STEPS[WORKLOAD])
    p.add_argument("--steps", type=int, default=None, help="RL steps (default: the MEG's)")
    p.add_argument("--episodes", type=int, default=None, help="episodes per step (the MEG's)")
    p.add_argument("--eval-limit", type=int, default=None, help="first N held-out problems")
    p.add_argument("--repeats", type=int, default=4, help="sampled episodes per problem")
    p.add_argument("--seeds", default="0", help="comma-separated model seeds")
    p.add_argument("--json", default="bench/results/word_problems.json")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="train on the running Dask cluster at ADDRESS (default: one the run lays out)",
    )
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="flexmarl-wp-") as tmp:
        setup = Setup(
            args.warm_steps,
            args.steps,
            args.episodes,
            args.eval_limit,
            args.repeats,
            args.scheduler,
        )
        results = run(seeds, setup, Path(tmp))
    render(results)
    write_results(results, args.json)
    return results


if __name__ == "__main__":
    main()
