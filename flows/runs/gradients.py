"""`run.rollout_gradients: auto` decided for the run's cluster and recorded in `run.json`
(the rule: `flows.orchestrator.rollout_grads`; the layout it goes with:
`flows.cluster.layout.colocated_for_gradients`)."""

from __future__ import annotations

from dataclasses import replace

from flows.cluster.layout import visible_gpus
from flows.cluster.start import ClusterConfig
from flows.orchestrator.rollout_grads import decide_auto
from flows.runs.backend import count_parameters
from flows.runs.record import Run


def decide_gradients(run: Run, cluster: ClusterConfig) -> Run:
    """`run.rollout_gradients: auto` decided for the laid-out cluster and recorded in
    run.json as `on` or `off` (`flows.orchestrator.rollout_grads`); its line printed."""
    spec = run.ctx.spec
    if spec.run.rollout_gradients != "auto":
        return run
    model = next(iter(spec.agents.values())).model
    on, line = decide_auto(
        spec,
        cluster.rollout_workers,
        visible_gpus(),
        own_cluster=not cluster.scheduler,
        parameters=count_parameters(model) if len(spec.agents) == 1 else None,
    )
    if on:
        print(line)
    spec = spec.with_run(rollout_gradients="on" if on else "off")
    run = replace(
        run, ctx=replace(run.ctx, spec=spec), sources={**run.sources, "rollout_gradients": "auto"}
    )
    run.save()
    return run
