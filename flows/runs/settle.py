"""A run's settings, settled once: everything `train(params)` decides before anything starts.

`settle` is the one stage. For a new run, in this order (each step reads what the ones before
it decided):

1. **resolve**: the MEG's `run:` section and the command line's overrides merged
   (`flows.runs.resolve`), then checked: a reward's declared reads, `rollout_gradients: on`
   where it cannot apply, a step too big;
2. **rollout engines**: every `backend: auto` agent gets `hf` or `vllm`
   (`flows.runs.engine_choice`); and the loss anchor the rollout policy's samples need goes
   to every agent that names none (`policies.implied`: Sparse-RL's correction);
3. **cluster layout**: the cluster the user gave, or the one chosen for the MEG on this machine
   (`flows.cluster.layout.for_meg`);
4. **rollout gradients**: `run.rollout_gradients: auto` decided `on` or `off` for that cluster
   (`flows.orchestrator.rollout_grads.decide_auto`).

A resumed run keeps what it recorded: only `steps` may grow (`flows.runs.resolve.continued`),
and its cluster is laid out again for this machine.

The result is one frozen value, `Settled`: the run (directory, context whose spec holds every
decided setting, and where each came from: `cli`, `meg`, `default` or `auto`), the cluster,
and the lines that say what was chosen for the user. `flows.train.prepare` writes `run.json`
from it once; nothing about the run is decided after. `flows.train.check` returns it and
`flexmarl train` hands it to the flow, so the CLI and the flow never decide twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from flows.cluster.layout import for_meg, visible_gpus
from flows.cluster.start import ClusterConfig
from flows.orchestrator.planning import scoring_plan
from flows.orchestrator.rollout_grads import decide_auto, on_problem
from flows.runs.config import load_config
from flows.runs.engine_choice import choose_engines, count_parameters
from flows.runs.record import Run, RunError, already_a_run, default_store, load_run
from flows.runs.resolve import OVERRIDABLE, continued, resolve
from meg.sizes import step_samples_problem
from policies import implied
from tasks.context import RunContext


class Asked(Protocol):
    """What a run is asked for: `flows.train.TrainParams` (its run settings, `mode` ...
    `keep_checkpoints`, are read by name: `OVERRIDABLE`)."""

    @property
    def config(self) -> str: ...
    @property
    def run_dir(self) -> str | None: ...
    @property
    def store(self) -> str | None: ...
    @property
    def resume(self) -> str | None: ...
    @property
    def cluster(self) -> ClusterConfig: ...
    @property
    def model_fields_set(self) -> set[str]: ...


Record = Literal["new", "changed", "kept"]


@dataclass(frozen=True, slots=True)
class Settled:
    """Everything decided about one run, once. `run.ctx.spec` holds the settings (engines
    chosen, `rollout_gradients` decided), `run.sources` where each came from; `record` says
    what `prepare` does with run.json: write a new one, rewrite a resumed run's (its steps
    grew, or an old record's `auto` was decided now), or keep it."""

    run: Run
    cluster: ClusterConfig  # the cluster the run starts or joins
    cluster_chosen: bool  # laid out for the MEG (else the user's, as given)
    notes: tuple[str, ...]  # what was chosen for the user, one line each (printed)
    record: Record

    @property
    def sources(self) -> dict[str, str]:
        """Where every decided value came from: the run settings and `auto` engines
        (`run.sources`, recorded in run.json) and the cluster (`chosen` or `given`)."""
        return {**self.run.sources, "cluster": "chosen" if self.cluster_chosen else "given"}


def overrides(p: Asked) -> dict[str, object]:
    """The run settings `p` gives (None: not given, the MEG's value stands)."""
    return {name: getattr(p, name) for name in OVERRIDABLE}


def settle(p: Asked) -> Settled:
    """The run `p` asks for, every setting decided (module docstring); nothing written.
    A user's mistake raises `RunError`."""
    gpus = visible_gpus()
    if p.resume:
        recorded = load_run(Path(p.resume))
        run, notes = resumed(p, recorded), list[str]()
        record: Record = "kept" if run is recorded else "changed"
    else:
        run, notes = planned(p, gpus)
        record = "new"
    cluster, laid_out = for_meg(run.ctx.spec, p.cluster, gpus=gpus)
    notes += [laid_out] if laid_out else []
    if run.ctx.spec.run.rollout_gradients == "auto":  # a new run's, or an old record's
        run, turned_on = gradients(run, cluster, gpus)
        notes += [turned_on] if turned_on else []
        record = "new" if record == "new" else "changed"
    return Settled(run, cluster, cluster is not p.cluster, tuple(notes), record)


def planned(p: Asked, gpus: int) -> tuple[Run, list[str]]:
    """A new run: its directory (refused if it holds a run), its settings resolved and
    checked, its `auto` engines chosen; and the lines saying what was chosen."""
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
    spec, notes = choose_engines(spec, gpus, own_cluster=not p.cluster.scheduler)
    spec, anchored, anchor_notes = implied(spec)
    notes += anchor_notes
    ctx = RunContext(
        run_id=f"{spec.name}-{stamp}",
        store_url=p.store or default_store(run_dir),
        spec=spec,
        train_slots=p.cluster.train_slots,
        rollout_gpu_share=p.cluster.rollout_gpu_share,
    )
    return Run(run_dir, ctx, {**sources, **chosen, **anchored}), notes


def resumed(p: Asked, run: Run) -> Run:
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


def gradients(run: Run, cluster: ClusterConfig, gpus: int) -> tuple[Run, str | None]:
    """`run.rollout_gradients: auto` decided `on` or `off` for `cluster`
    (`flows.orchestrator.rollout_grads.decide_auto`), its source `auto`; the line that says
    so when it turned on (None: off)."""
    spec = run.ctx.spec
    model = next(iter(spec.agents.values())).model
    on, line = decide_auto(
        spec,
        cluster.rollout_workers,
        gpus,
        own_cluster=not cluster.scheduler,
        parameters=count_parameters(model) if len(spec.agents) == 1 else None,
    )
    spec = spec.with_run(rollout_gradients="on" if on else "off")
    sources = {**run.sources, "rollout_gradients": "auto"}
    return replace(run, ctx=replace(run.ctx, spec=spec), sources=sources), line if on else None
