"""The `train` flow: the product's main job (what `flexmarl train` and deployments run).

prepare   resolve the config, create (or reopen) the run directory and the store
cluster   start or join the Dask cluster (one Prefect API server is already up)
pipeline  compile MEG × steps × micro-batches into tasks and run them (flows.orchestrator.pipeline)
finalize  audit consistency from the store, summarise, plot, publish artifacts, export
"""

from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from flows.cluster.bootstrap import refuse_while_spawning
from flows.cluster.layout import for_meg, visible_gpus
from flows.cluster.lease import cluster_lease
from flows.cluster.reach import check_reachable
from flows.cluster.start import ClusterConfig, Workers, dask_cluster
from flows.export import export_final
from flows.orchestrator.executors import DaskExecutor, PrefectExecutor
from flows.orchestrator.futures import WatchUnit
from flows.orchestrator.pipeline import Pipeline
from flows.orchestrator.planning import scoring_plan
from flows.orchestrator.rollout_grads import on_problem
from flows.orchestrator.watch import UNIT_SECONDS, watch_steps
from flows.report.artifacts import publish, reward_curve, timeline
from flows.report.logs import orchestrator_logs
from flows.report.metrics import reward_gain, summary, timings
from flows.report.progress import Progress
from flows.report.tracking import active, fan_out, tracking
from flows.runs.backend import choose_backends
from flows.runs.config import load_config
from flows.runs.gradients import decide_gradients
from flows.runs.record import (
    Run,
    RunError,
    already_a_run,
    default_store,
    load_run,
    resume_point,
)
from flows.runs.resolve import RUN_FIELDS, continued, resolve
from meg.limits import MAX_SEED, MAX_STEP_SAMPLES, MAX_WINDOW
from meg.render import mermaid
from meg.sizes import step_samples_problem
from storage.audit import audit_consistency
from storage.store import MEGStore
from tasks.context import RunContext
from workloads import BUILTIN, plugins


class TrainParams(BaseModel):
    """Parameters of a training run. The run settings (`mode` ... `rollout_gradients`) left
    unset come from the MEG's `run:` section; `plan` merges them once (flows.runs.resolve)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str = Field(
        "math-chain",
        description=f"MEG YAML file or built-in workload ({', '.join(BUILTIN)})",
    )
    mode: Literal["sync", "flex", "async"] | None = Field(
        None, description="sync (barrier per step), flex (zero staleness), async (η steps)"
    )
    staleness: int | None = Field(
        None, ge=0, description="η of async mode: rows may come from versions >= k - η"
    )
    steps: int | None = Field(None, ge=1, description="optimizer steps per agent")
    episodes_per_step: int | None = Field(
        None, ge=1, le=MAX_STEP_SAMPLES, description="episodes of one step"
    )
    micro_batches: int | None = Field(None, ge=1, description="micro-batches of one step")
    window: int | None = Field(
        None, ge=1, le=MAX_WINDOW, description="steps in flight at once (default 2)"
    )
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="seed of data order and sampling")
    run_dir: str | None = Field(None, description="run directory (default runs/<name>-<time>)")
    store: str | None = Field(
        None, description="fsspec URL of the MEG Store (default <run_dir>/store)"
    )
    resume: str | None = Field(
        None,
        description="run directory of a killed run to continue (with --steps N: a finished "
        "run, to N steps)",
    )
    balance: bool | None = Field(
        None, description="hierarchical rollout load balancing (else a static equal split)"
    )
    elastic: bool | None = Field(
        None,
        description="move agents' training between workers from measured load (default off)",
    )
    rollout_gradients: Literal["auto", "on", "off"] | None = Field(
        None, description="back-propagate micro-batches on the rollout workers (default auto)"
    )
    executor: Literal["hybrid", "prefect", "dask"] = Field(
        "hybrid",
        description="hybrid: plain Dask futures per node, a Prefect task run per step (per "
        "second of steps when they are shorter); "
        "prefect: a Prefect task run per node and micro-batch; dask: no Prefect tasks",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=1,
        description="optimizer steps between checkpoints (default: every step; a one-agent run "
        "every 10)",
    )
    keep_checkpoints: int | None = Field(
        None, ge=1, description="newest checkpoints kept per agent (default 2)"
    )
    cluster: ClusterConfig = ClusterConfig()
    summary_json: str | None = Field(None, description="also write the summary JSON here")
    export_final: bool = Field(True, description="export final/<agent>/ at the end")
    export: Literal["adapter", "merged"] = Field(
        "adapter",
        description="final/<agent>/ of a LoRA agent: its PEFT adapter, or the HF model with "
        "the adapter merged in (the adapter then in final/<agent>/adapter)",
    )


# TrainParams fields that override the MEG's `run:` settings (flows.runs.resolve).
RUN_OVERRIDES = tuple(f for f in TrainParams.model_fields if f in RUN_FIELDS)
_CHECKED: dict[str, Run] = {}  # params JSON → the run `check` planned, for `prepare`


def overrides(p: TrainParams) -> dict[str, object]:
    """The run settings `p` gives (None: not given, the MEG's value stands)."""
    return {f: getattr(p, f) for f in RUN_OVERRIDES}


def plan(p: TrainParams) -> Run:
    """The new run `p` asks for, resolved and checked, nothing written yet: its directory,
    and its context whose spec holds the run settings after the command line's overrides."""
    spec = load_config(p.config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(p.run_dir or f"runs/{spec.name}-{stamp}").resolve()
    already_a_run(run_dir)
    try:
        spec, sources = resolve(spec, overrides(p))
        scoring_plan(spec)  # a reward's declared reads must name nodes of the graph
    except ValueError as e:
        raise RunError(str(e)) from None
    if problem := on_problem(spec):
        raise RunError(problem)
    if problem := step_samples_problem(spec, spec.run.episodes_per_step):
        given = sources["episodes_per_step"] == "cli"
        raise RunError(f"{'--episodes-per-step' if given else 'run.episodes_per_step'}: {problem}")
    chosen = {f"agents.{a}.backend": "auto" for a, s in spec.agents.items() if s.backend == "auto"}
    spec, notes = choose_backends(spec, visible_gpus(), own_cluster=not p.cluster.scheduler)
    ctx = RunContext(
        run_id=f"{spec.name}-{stamp}",
        store_url=p.store or default_store(run_dir),
        spec=spec,
        train_slots=p.cluster.train_slots,
        rollout_gpu_share=p.cluster.rollout_gpu_share,
    )
    return Run(run_dir, ctx, {**sources, **chosen}, notes=tuple(notes))


def resumed(p: TrainParams, run: Run) -> Run:
    """`run` (the one `p.resume` names), with its steps raised if `p` asks (`continued`);
    the MEG file is compared only when given explicitly. `run` itself if nothing changes."""
    meg = load_config(p.config) if "config" in p.model_fields_set else None
    try:
        spec = continued(run.ctx.spec, overrides(p), meg)
    except ValueError as e:
        raise RunError(str(e)) from None
    if spec is run.ctx.spec:
        return run
    return replace(run, ctx=replace(run.ctx, spec=spec), sources={**run.sources, "steps": "cli"})


def check(p: TrainParams) -> Run:
    """Everything a user can get wrong, checked before any server or cluster starts: the run
    `train(p)` will start (a new run's plan, kept for `prepare`; or the run to resume)."""
    if p.resume:
        return resumed(p, load_run(Path(p.resume)))
    run = plan(p)
    _CHECKED.clear()  # one plan is kept: the one the next `prepare` of the same params uses
    _CHECKED[p.model_dump_json()] = run
    return run


def prepare(p: TrainParams) -> Run:
    """Phase 1: a new run written to its directory (the plan `check` made, or a fresh one),
    or the resume point of an existing run."""
    if p.resume:
        recorded = load_run(Path(p.resume))
        run = resumed(p, recorded)
        if run is not recorded:
            run.save()  # continued to more steps: the record says so from now on
        return resume_point(run)
    key = p.model_dump_json()
    if key in _CHECKED:  # planned by `check`: the directory may have been taken since
        run = _CHECKED.pop(key)
        already_a_run(run.dir)
    else:
        run = plan(p)
    run.save()
    (run.dir / "meg.mmd").write_text(mermaid(run.ctx.spec))
    ctx = run.ctx
    MEGStore.open(ctx.store_url, ctx.run_id, storage_options=ctx.storage_options)
    return run


def run_pipeline(
    run: Run, workers: Workers, executor: Any, watch: bool = False
) -> tuple[list[Any], float, float]:
    """Phase 3: the training loop over steps, as a bounded window of compiled steps.

    `watch`: Prefect task runs over the steps' futures, one a step or, for steps shorter
    than a second, one per second of steps (`flows.orchestrator.watch.watch_steps`)."""
    steps = run.ctx.steps
    agents = [
        a for a in run.ctx.spec.agents if any(n.agent == a for n in run.ctx.spec.nodes.values())
    ]
    t0 = time.time()
    watchers: list[Any] = []
    unit: WatchUnit | None = None
    track = active(run.ctx.run_id)
    progress = Progress(agents, steps - run.start_step, run.start_step)
    with orchestrator_logs(), progress:  # the balancer's and allocator's moves in the log
        on_event = progress if track is None else fan_out(progress, track)
        if track is not None:
            track.start(t0)
        pipe = Pipeline(run.ctx, workers, executor, run.start_step, run.base_versions, on_event)
        try:
            for k in range(run.start_step, steps):
                pipe.wait_window(k)  # at most `window` steps in flight
                pipe.submit_rollout(k)  # generate every node, score each group when it can
                pipe.submit_training(k)  # accumulate micro-batches, step, publish
                if watch:
                    log = pipe.step_log(k)
                    if unit is None or not unit.add(log):  # a new task run from step k on
                        unit = WatchUnit(k, log, UNIT_SECONDS)
                        watchers.append(watch_steps.submit(k, unit))
            results = pipe.finish()
        except BaseException as e:
            pipe.abort(e)  # the per-step task runs fail with the run instead of waiting
            raise
        finally:
            if unit is not None:
                unit.close()
        for w in watchers:
            w.result()
    return results, t0, time.time() - t0


@flow(name="flexmarl-pipeline", log_prints=True)
def pipeline_flow(
    run_dir: str,
    scheduler: str,
    rollout: list[str],
    train: list[str],
    pins: dict[str, dict[str, Any]],
    per_node: bool = False,
) -> list[Any]:
    """The compiled task graph. `per_node`: every generate/score/train/step is a Prefect task
    run (this flow then runs on a DaskTaskRunner); otherwise the nodes are plain Dask futures
    and one Prefect task run per step (per second of steps, when they are shorter) covers
    them (`flows.orchestrator.watch`)."""
    run = resume_point(load_run(Path(run_dir)))
    workers = Workers(scheduler, tuple(rollout), tuple(train), pins)
    if per_node:
        results, t0, wall = run_pipeline(run, workers, PrefectExecutor())
    else:
        from distributed import Client

        with Client(scheduler) as client:
            results, t0, wall = run_pipeline(run, workers, DaskExecutor(client), watch=True)
    return [results, t0, wall]


def check_workers(run: Run, workers: Workers) -> None:
    """Every worker can open the run's local models and store (flows.cluster.reach)."""
    from distributed import Client

    with Client(workers.address) as client:
        check_reachable(client, run.ctx.spec, run.ctx.store_url)


def ship_plugins(run: Run, workers: Workers) -> None:
    """The MEG's own modules onto every worker (also workers that join later)."""
    if not run.ctx.spec.plugins:
        return
    from distributed import Client

    with Client(workers.address) as client:
        plugins.ship(client, run.ctx.run_id, run.ctx.spec.plugins)


def execute(run: Run, workers: Workers, executor: str) -> tuple[list[Any], float, float]:
    """Run the pipeline with one of three executors (see `TrainParams.executor`)."""
    if executor == "dask":
        from distributed import Client

        with Client(workers.address) as client:
            return run_pipeline(run, workers, DaskExecutor(client))
    args = (str(run.dir), workers.address, list(workers.rollout), list(workers.train), workers.pins)
    if executor == "hybrid":
        results, t0, wall = pipeline_flow(*args)
        return results, t0, wall
    from prefect_dask import DaskTaskRunner

    runner = DaskTaskRunner(address=workers.address)
    sub = pipeline_flow.with_options(task_runner=runner)  # type: ignore[arg-type]
    results, t0, wall = sub(*args, per_node=True)
    return results, t0, wall


def finalize(
    run: Run, results: list[Any], t0: float, wall: float, workers: Workers, p: TrainParams
) -> dict[str, Any]:
    """Phase 4: audit from the store, summary JSON, plots, Prefect artifacts."""
    ctx = run.ctx
    store = MEGStore.open(ctx.store_url, ctx.run_id, storage_options=ctx.storage_options)
    audit = audit_consistency(store)
    out = summary(
        mode=ctx.mode,
        staleness=ctx.staleness,
        results=results,
        t0=t0,
        wall_s=wall,
        n_workers=len(workers.all),
        audit=audit,
        store_url=ctx.store_url,
        run_id=ctx.run_id,
        run_dir=str(run.dir),
        workload=ctx.spec.name,
    )
    out["reward_gain_last3_vs_first3"] = round(reward_gain(out["per_step"]), 4)
    title = f"{ctx.spec.name} · {ctx.mode}"
    if out["per_step"]:
        reward_curve(out["per_step"], run.dir / "reward_curve.png", title)
        timeline(timings(results), run.dir / "timeline.png", title)
    (run.dir / "summary.json").write_text(json.dumps(out, indent=2))
    (run.dir / "timeline.json").write_text(json.dumps([asdict(t) for t in timings(results)]))
    if p.summary_json:
        Path(p.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(p.summary_json).write_text(json.dumps(out, indent=2))
    if out["per_step"]:
        key = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"{ctx.spec.name}-{ctx.mode}".lower()))
        publish(run.dir, out, mermaid(ctx.spec), key)
    return out


@flow(name="flexmarl-train", log_prints=True)
def train(params: TrainParams = TrainParams()) -> dict[str, Any]:  # noqa: B008
    """Train the agents of a MEG with RL: sync, flex (default) or async(η) mode."""
    refuse_while_spawning("flexmarl train")  # a script without the main guard, re-imported
    run = prepare(params)
    for note in run.notes:
        print(note)
    cluster = layout(run, params.cluster)
    run = decide_gradients(run, cluster)
    with run_tracking(run, cluster) as track:  # run.tracking: opened before the cluster
        with dask_cluster(cluster) as workers, ExitStack() as held:
            if cluster.scheduler:  # a cluster this run did not start: shared, other hosts
                held.enter_context(cluster_lease(workers.address, run.ctx.run_id, str(run.dir)))
                check_workers(run, workers)
            ship_plugins(run, workers)
            track.roles = (len(workers.rollout), len(workers.train))
            results, t0, wall = execute(run, workers, params.executor)
            # the summary first (a failed export loses none of it), then the exports while
            # the cluster is up: a cluster of ours exports on its worker (flows.export)
            out = finalize(run, results, t0, wall, workers, params)
            if params.export_final:
                export_final(run, None if cluster.scheduler else workers, params.export)
        if params.export_final:
            track.log_models(run.dir / "final")
    return out


def layout(run: Run, given: ClusterConfig) -> ClusterConfig:
    """The cluster the run starts (`flows.cluster.layout.for_meg`), its line in the flow
    run's log when it chose."""
    cluster, line = for_meg(run.ctx.spec, given)
    if line:
        print(line)
    return cluster


def run_tracking(run: Run, cluster: ClusterConfig) -> Any:
    """The run's trackers (`run.tracking`), with the resolved MEG, the settings' sources and
    the cluster as their parameters (docs/tracking.md)."""
    ctx = run.ctx
    config = {
        "meg": ctx.spec.model_dump(mode="json"),
        "sources": run.sources,
        "cluster": cluster.model_dump(mode="json"),
    }
    agents = len({n.agent for n in ctx.spec.nodes.values()})
    return tracking(ctx.spec.run.tracking, run.dir, ctx.run_id, ctx.spec.name, agents, config)
