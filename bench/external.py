"""External-policy rollouts against on-policy ones: what a stronger frozen model's samples in
the learner's groups do to its held-out reward, at the same samples a step.

    python -m bench.external [--small] [--learner DIR] [--teacher DIR] [--seeds S]
                             [--steps K] [--rows R] [--heldout N] [--json PATH]
                             [--scheduler ADDRESS]

The workload is `longtail` on the `hf` backend, 8 episodes a step. The learner is a tiny
model warm-started part way on the format (`LEARNER_WARM` steps: it ends some lists right,
held-out reward ~0.28); the external policy is the same tiny model warm-started to its
preset (200 steps: ~0.87, a stronger model with the same tokenizer), frozen. (At 30 warm
steps the learner scores 0 held out, and so does every run of both arms after 8 steps:
that compares nothing.) Each seed runs twice, interleaved: `on_policy` (every group's n = 4
samples the learner's) and `external` (`run.rollout: external`: the counter's groups take
`rows` of their 4 from the teacher, the `external` anchor corrects for them). Both arms
sample 4 responses a group; the tokens each sampled are reported beside.

- `external_reward_delta`: the median over seeds of the external arm's held-out team reward
  minus the on-policy arm's of the same seed, with `external_reward_delta_spread` (the
  deltas' max − min) and `on_policy_heldout_spread` (the on-policy arm's own max − min)
  to judge it by;
- `external_row_share`: the share of the counter's consumed rows the teacher sampled (the
  audit's count), `external_token_frac`: the share of its trained tokens;
- `teacher_heldout`, `learner_base_heldout`: the two models' held-out reward untrained.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from contextlib import ExitStack
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from bench.common import cpu_model, train_run, write_results
from bench.longtail import build_model, config_copy, heldout_reward
from storage.audit import audit_consistency
from storage.store import MEGStore

ARMS = ("on_policy", "external")
LEARNER_WARM = 60  # warm-start steps of the learner (the teacher: the preset's)
AGENT = "counter"  # the agent whose groups take the teacher's rows


def config(arm: str, learner: str, teacher: str, out: Path, sizes: tuple[int, int, int]) -> Path:
    """The longtail workload on `learner` (hf backend), 8 episodes a step, with `arm`'s
    rollouts; `sizes`: (steps, seed, rows)."""
    steps, seed, rows = sizes
    path = config_copy("longtail", "hf", learner, out, steps, 8, 16, seed)
    data = yaml.safe_load(path.read_text())
    if arm == "external":
        data["run"]["rollout"] = {
            "policy": "external",
            "sources": {AGENT: {"model": teacher, "rows": rows}},
        }
    path = out / f"longtail-{arm}-s{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def shares(summary: dict[str, Any]) -> tuple[float, float, int]:
    """(the share of the counter's consumed rows an external policy sampled, the mean share
    of its trained tokens, the response tokens its rollouts generated)."""
    store = MEGStore.open(summary["store_url"], summary["run_id"], create=False)
    audit = audit_consistency(store, [AGENT])
    log = store.table(AGENT).consumption_log().values()
    fracs = [rec["extra"]["metrics"].get("external_frac", 0.0) for rec in log]
    tokens = int(store.table(AGENT).read().response_lengths.sum())
    return audit.external_rows / max(audit.rows_checked, 1), statistics.fmean(fracs), tokens


def training(
    learner: str, teacher: str, work: Path, sizes: tuple[int, int, int, int], scheduler: str | None
) -> dict[str, Any]:
    """Every seed's two arms (interleaved) on one default cluster (started here, or the one
    at `scheduler`: the arms are compared by reward, not time)."""
    from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api

    with prefect_api(), ExitStack() as stack:
        if scheduler is None:
            scheduler = stack.enter_context(dask_cluster(ClusterConfig())).address
        return _training(learner, teacher, work, sizes, scheduler)


def _training(
    learner: str, teacher: str, work: Path, sizes: tuple[int, int, int, int], scheduler: str
) -> dict[str, Any]:
    seeds, steps, rows, heldout = sizes
    rewards: dict[str, list[float]] = {a: [] for a in ARMS}
    tokens: dict[str, list[int]] = {a: [] for a in ARMS}
    row_share: list[float] = []
    token_frac: list[float] = []
    for seed in range(seeds):
        for arm in ARMS if seed % 2 == 0 else ARMS[::-1]:
            cfg = config(arm, learner, teacher, work, (steps, seed, rows))
            run_dir = work / f"{arm}-{seed}"
            out = train_run(cfg, run_dir, scheduler)
            rewards[arm].append(round(heldout_reward(cfg, run_dir, heldout), 4))
            share, frac, sampled = shares(out)
            tokens[arm].append(sampled)
            if arm == "external":
                row_share.append(share)
                token_frac.append(frac)
    deltas = [e - o for e, o in zip(rewards["external"], rewards["on_policy"], strict=True)]
    base = config("on_policy", learner, teacher, work, (steps, 0, rows))
    return {
        "heldout_reward": rewards,
        "sampled_tokens": tokens,
        "external_reward_delta": round(statistics.median(deltas), 4),
        "external_reward_delta_spread": round(max(deltas) - min(deltas), 4),
        "on_policy_heldout_spread": round(max(rewards["on_policy"]) - min(rewards["on_policy"]), 4),
        "external_row_share": round(statistics.fmean(row_share), 4),
        "external_token_frac": round(statistics.fmean(token_frac), 4),
        "teacher_heldout": round(heldout_reward(base, Path(teacher), heldout), 4),
        "learner_base_heldout": round(heldout_reward(base, Path(learner), heldout), 4),
    }


def run(
    sizes: tuple[int, int, int, int],
    work: Path,
    learner: str | None,
    teacher: str | None,
    warm: tuple[int | None, int | None] = (LEARNER_WARM, None),
    scheduler: str | None = None,
) -> dict[str, Any]:
    """The arms at `sizes` (seeds, steps, rows, held-out episodes a task); a model not
    given is built here, warm-started `warm` steps (learner, teacher; None: the preset)."""
    built = learner is None  # a learner given was warm-started as whoever built it
    learner = learner or build_model("longtail", work / "learner", warm[0])
    teacher = teacher or build_model("longtail", work / "teacher", warm[1])
    seeds, steps, rows, heldout = sizes
    res: dict[str, Any] = {
        "date": str(date.today()),
        "machine": cpu_model(),
        "cpus": os.cpu_count(),
        "seeds": seeds,
        "steps": steps,
        "rows": rows,
        "group_size": 4,
        "heldout_episodes": heldout,
        "learner_warm_steps": warm[0] if built else None,
    }
    return res | training(learner, teacher, work, sizes, scheduler)


def render(res: dict[str, Any]) -> None:
    t = Table(
        title=f"external-policy rollouts · longtail · {res['seeds']} seeds × {res['steps']} "
        f"steps · {res['rows']} of 4 a group from the teacher"
    )
    for col in ("arm", "held-out reward per seed", "sampled tokens per seed"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    for arm in ARMS:
        t.add_row(
            arm,
            ", ".join(f"{x:.3f}" for x in res["heldout_reward"][arm]),
            ", ".join(str(x) for x in res["sampled_tokens"][arm]),
        )
    Console(width=120).print(t)
    keys = [k for k in res if k.startswith(("external_", "on_policy_", "teacher_", "learner_"))]
    print(", ".join(f"{k} {res[k]}" for k in keys))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="1 seed of 1 step, both models given")
    p.add_argument(
        "--learner", help=f"a longtail model (default: built here, warm-started {LEARNER_WARM})"
    )
    p.add_argument("--teacher", help="the external model (default: built here, the preset)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rows", type=int, default=1, help="of each group's 4, the teacher's")
    p.add_argument("--heldout", type=int, default=2, help="episodes per held-out task")
    p.add_argument("--json", default="bench/results/external.json")
    p.add_argument("--scheduler", help="run the arms on this cluster (--small)")
    args = p.parse_args(argv)
    sizes = (
        (1, 1, args.rows, 1) if args.small else (args.seeds, args.steps, args.rows, args.heldout)
    )
    with tempfile.TemporaryDirectory(prefix="flexmarl-external-") as tmp:
        res = run(sizes, Path(tmp), args.learner, args.teacher, scheduler=args.scheduler)
    render(res)
    write_results(res, args.json)
    return res


if __name__ == "__main__":
    main()
