"""Which agents back-propagate on their rollout workers (`run.rollout_gradients`).

With it on, each micro-batch's gradient is computed inside its generate task, on the rollout
worker that sampled and scored it, and the agent's optimizer step adds the parts and steps
(`tasks.grad_parts`): no train task per micro-batch, no rows sent to the trainer, and the
micro-batches back-propagate side by side on one thread each instead of one after the other
on the trainer's threads.

It applies to the agent of a one-node MEG (whose generate task already scores its rows:
`pipeline.fused_scores`) that trains full weights in float32 (a LoRA adapter or bf16
masters would need the trainer's own state on every rollout worker) in `flex` or `sync`
mode (in `async` mode rows are sampled with an older version than the trainer holds, so a
part computed at sampling time would be the wrong gradient), rolling out whole episodes
(`run.rollout` other than `april`).

`auto` (the default) is decided once the run's cluster is laid out, and `run.json` records
`on` or `off`: on only where it was measured faster, a model of at most
`AUTO_MAX_PARAMETERS` with at least one rollout worker per micro-batch (otherwise one worker
back-propagates several micro-batches on one thread while the trainer's cores wait), on a
cluster this run starts, without GPUs (a rollout worker's GPU holds the engine, sized to
leave the rest to a trainer; a second copy of the model there is not planned for). The
measurements behind the bound: docs/peers.md.
"""

from __future__ import annotations

from meg import MEGSpec

AUTO_MAX_PARAMETERS = 2_000_000  # measured at 0.5 M parameters (docs/peers.md)


def why_not(spec: MEGSpec, agent: str) -> str | None:
    """Why `agent` cannot back-propagate on its rollout workers, or None when it can."""
    a, run = spec.agents[agent], spec.run
    nodes = [n for n, node in spec.nodes.items() if node.agent == agent]
    rules = (
        (len(spec.nodes) != 1, f"the MEG has {len(spec.nodes)} nodes, not one"),
        (not nodes, "it serves no node"),
        (any(spec.nodes[n].is_tool for n in nodes), "its node is a tool node"),
        (a.lora is not None, "it trains a LoRA adapter"),
        (a.dtype != "float32", f"it trains in {a.dtype}"),
        (run.mode == "async", "async rows are sampled with an older version than it trains"),
        (run.rollout.carries, f"run.rollout {run.rollout.policy} carries partial rollouts"),
    )
    return next((why for applies, why in rules if applies), None)


def on_problem(spec: MEGSpec) -> str | None:
    """What is wrong with `rollout_gradients: on` for this MEG (None: nothing, or not on)."""
    if spec.run.rollout_gradients != "on":
        return None
    refused = {a: why for a in spec.agents if (why := why_not(spec, a)) is not None}
    if not refused:
        return None
    return "run.rollout_gradients: on, but " + "; ".join(
        f"agent {a!r} cannot back-propagate on its rollout workers: {why}"
        for a, why in refused.items()
    )


def gradient_agents(spec: MEGSpec) -> frozenset[str]:
    """The agents whose micro-batches back-propagate on the rollout workers (after `auto`
    was decided: `on` or `off`)."""
    if spec.run.rollout_gradients != "on":
        return frozenset()
    return frozenset(a for a in spec.agents if why_not(spec, a) is None)


def decide_auto(
    spec: MEGSpec, rollout_workers: int, gpus: int, own_cluster: bool, parameters: int | None
) -> tuple[bool, str]:
    """`auto` → on or off for this run's cluster, and the line the run prints. `parameters`:
    the size of the (one) agent's model, None when it cannot be counted here."""
    agent = next(iter(spec.agents)) if len(spec.agents) == 1 else None
    m = spec.run.micro_batches
    unable = why_not(spec, agent) if agent is not None else None
    rules = (
        (agent is None, f"{len(spec.agents)} agents"),
        (unable is not None, str(unable)),
        (not own_cluster, "the workers are another cluster's"),
        (gpus > 0, f"{gpus} GPU(s) seen"),
        (m < 2 or rollout_workers < m, f"{rollout_workers} rollout worker(s), {m} micro-batches"),
        (parameters is None, "its model's size cannot be read here"),
        (
            (parameters or 0) > AUTO_MAX_PARAMETERS,
            f"{parameters} parameters (measured faster up to {AUTO_MAX_PARAMETERS})",
        ),
    )
    for applies, why in rules:
        if applies:
            return False, f"rollout_gradients auto: off ({why})"
    return True, (
        f"rollout_gradients auto: on ({parameters} parameters, {rollout_workers} rollout "
        f"workers for {m} micro-batches): each micro-batch back-propagates where it was sampled"
    )
