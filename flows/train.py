"""The `train` flow: the product's main job (what `flexmarl train` and deployments run).

settle    every setting decided once (flows.runs.settle): resolved, engines, layout, gradients
prepare   record it: create (or reopen) the run directory, run.json and the store
cluster   start or join the Dask cluster (one Prefect API server is already up)
pipeline  compile MEG × steps × micro-batches into tasks and run them (flows.orchestrator.pipeline)
finalize  audit consistency from the store, summarise, plot, publish artifacts, export
"""

from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field, SkipValidation, create_model
from pydantic.json_schema import SkipJsonSchema

from flows.cluster.bootstrap import refuse_while_spawning
from flows.cluster.lease import cluster_lease
from flows.cluster.reach import check_reachable
from flows.cluster.start import ClusterConfig, Workers, dask_cluster
from flows.export import export_final
from flows.orchestrator.executors import DaskExecutor, PrefectExecutor
from flows.orchestrator.futures import WatchUnit
from flows.orchestrator.pipeline import Pipeline
from flows.orchestrator.step_tasks import UNIT_SECONDS, watch_steps
from flows.report.artifacts import plots_wanted, publish, reward_curve, timeline
from flows.report.logs import orchestrator_logs
from flows.report.metrics import reward_gain, summary, timings
from flows.report.progress import Progress
from flows.report.tracking import active, fan_out, tracking
from flows.runs.record import Run, already_a_run, load_run, resume_point
from flows.runs.resolve import override_fields
from flows.runs.settle import Settled, settle
from meg.render import mermaid
from storage.audit import audit_consistency
from storage.store import MEGStore
from workloads import BUILTIN, plugins


class _Workload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str = Field(
        "math-chain",
        description=f"MEG YAML file or built-in workload ({', '.join(BUILTIN)})",
    )


# The run settings a flag overrides (`mode` ... `keep_checkpoints`: `flows.runs.resolve.
# OVERRIDABLE`), generated from `RunSpec`: their types, bounds and help are declared there
# only. A type checker does not see them: typed code reads them with
# `flows.runs.settle.overrides` and passes them as keywords from a mapping.
if TYPE_CHECKING:

    class _WithRunSettings(_Workload):
        """What a type checker sees (no run settings)."""

else:
    _WithRunSettings = create_model(
        "_WithRunSettings", __base__=_Workload, __module__=__name__, **override_fields()
    )


class TrainParams(_WithRunSettings):
    """Parameters of a training run. The run settings (`mode` ... `keep_checkpoints`, fields
    generated from `RunSpec`) left unset come from the MEG's `run:` section; `check` settles
    them once (`flows.runs.settle`)."""

    run_dir: str | None = Field(None, description="run directory (default runs/<name>-<time>)")
    store: str | None = Field(
        None, description="fsspec URL of the MEG Store (default <run_dir>/store)"
    )
    resume: str | None = Field(
        None,
        description="run directory of a killed run to continue (with --steps N: a finished "
        "run, to N steps)",
    )
    executor: Literal["hybrid", "prefect", "dask"] = Field(
        "hybrid",
        description="hybrid: plain Dask futures per node, a Prefect task run per step (per "
        "second of steps when they are shorter); "
        "prefect: a Prefect task run per node and micro-batch; dask: no Prefect tasks",
    )
    cluster: ClusterConfig = ClusterConfig()
    summary_json: str | None = Field(None, description="also write the summary JSON here")
    export_final: bool = Field(True, description="export final/<agent>/ at the end")
    export: Literal["adapter", "merged"] = Field(
        "adapter",
        description="final/<agent>/ of a LoRA agent: its PEFT adapter, or the HF model with "
        "the adapter merged in (the adapter then in final/<agent>/adapter)",
    )


def check(p: TrainParams) -> Settled:
    """Everything a user can get wrong, checked before any server or cluster starts, and
    everything the run decides, decided (`flows.runs.settle`): what `prepare` (or
    `train(p, settled)`) starts from. Nothing is written."""
    return settle(p)


def prepare(p: TrainParams, settled: Settled | None = None) -> Run:
    """Phase 1: the settled run (`check(p)`'s, or settled now) recorded in its directory:
    a new run's run.json, its graph and its store; or the resume point of an existing run
    (its run.json rewritten only when it changed). The one write of run.json."""
    settled = settled or settle(p)
    run = settled.run
    if settled.record == "new":
        already_a_run(run.dir)  # taken since `check`?
        run.save()
        (run.dir / "meg.mmd").write_text(mermaid(run.ctx.spec))
        ctx = run.ctx
        MEGStore.open(ctx.store_url, ctx.run_id, storage_options=ctx.storage_options)
        return run
    if settled.record == "changed":
        run.save()  # continued to more steps: the record says so from now on
    return resume_point(run)


def run_pipeline(
    run: Run, workers: Workers, executor: Any, watch: bool = False
) -> tuple[list[Any], float, float]:
    """Phase 3: the training loop over steps, as a bounded window of compiled steps.

    `watch`: Prefect task runs over the steps' futures, one a step or, for steps shorter
    than a second, one per second of steps (`flows.orchestrator.step_tasks.watch_steps`)."""
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
    them (`flows.orchestrator.step_tasks`)."""
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
    """Phase 4: audit from the store, summary JSON, plots (unless `FLEXMARL_PLOTS=0`:
    `flows.report.artifacts`), Prefect artifacts."""
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
    pictures = plots_wanted()
    if out["per_step"] and pictures:
        reward_curve(out["per_step"], run.dir / "reward_curve.png", title)
        timeline(timings(results), run.dir / "timeline.png", title)
    (run.dir / "summary.json").write_text(json.dumps(out, indent=2))
    (run.dir / "timeline.json").write_text(json.dumps([asdict(t) for t in timings(results)]))
    if p.summary_json:
        Path(p.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(p.summary_json).write_text(json.dumps(out, indent=2))
    if out["per_step"]:
        key = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"{ctx.spec.name}-{ctx.mode}".lower()))
        publish(run.dir, out, mermaid(ctx.spec), key, pictures)
    return out


# `train`'s second parameter: a run `check` settled (`flexmarl train` passes it on); hidden
# from a deployment's form and not validated again (a deployment leaves it None)
Checked = Annotated[Settled | None, SkipValidation, SkipJsonSchema()]


@flow(name="flexmarl-train", log_prints=True)
def train(params: TrainParams = TrainParams(), settled: Checked = None) -> dict[str, Any]:  # noqa: B008
    """Train the agents of a MEG with RL: sync, flex (default) or async(η) mode. `settled`:
    what `check(params)` returned (None: settled here)."""
    refuse_while_spawning("flexmarl train")  # a script without the main guard, re-imported
    settled = settled or settle(params)
    for note in settled.notes:  # what was chosen for the user, in the flow run's log
        print(note)
    run, cluster = prepare(params, settled), settled.cluster
    with run_tracking(run, settled) as track:  # run.tracking: opened before the cluster
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


def run_tracking(run: Run, settled: Settled) -> Any:
    """The run's trackers (`run.tracking`), with the resolved MEG, the settings' sources and
    the cluster as their parameters (docs/tracking.md)."""
    ctx = run.ctx
    config = {
        "meg": ctx.spec.model_dump(mode="json"),
        "sources": run.sources,
        "cluster": settled.cluster.model_dump(mode="json"),
    }
    agents = len({n.agent for n in ctx.spec.nodes.values()})
    return tracking(ctx.spec.run.tracking, run.dir, ctx.run_id, ctx.spec.name, agents, config)
