"""Training tasks: accumulate one micro-batch, then one optimizer step + publication.

`train_micro_batch(A, k, j)` (body: `accumulate_micro_batch`) binds agent A to a training
slot on this worker (the slot manager swaps the least-recently-used agent out through the
StateStore if none is free), takes A's scored rows of (k, j) (from the generate task that
handed them over when A has one node, else from the store), and accumulates gradients.
Pending gradients are part of the swapped state, so another agent may use the slot between
two micro-batches. `optimizer_step(A, k)` (body: `step_agent`) steps once — only on
exactly the step's micro-batches (see `tasks.accounting`, which also rebuilds a trainer a dead
worker lost) — publishes version k+1 for the rollout hosts, writes the consumption log that
makes the consistency rule auditable from the store, and checkpoints (always at the run's last
step, so the final export is the last step's weights whatever `checkpoint_every` says).
`hand_over(A, k)` (body: `hand_over_agent`) runs where A trained until step k when elastic
allocation moves A's training elsewhere: A's state goes to the run's StateStore root, where
the next worker's slots find it.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from prefect import task

from engines.model_files import local_dir
from engines.training.accum import Accum
from engines.training.checkpoint import maybe_checkpoint, restore_latest, save_checkpoint
from engines.training.checkpoint_index import checkpoint_dir, prune_checkpoints
from engines.training.publish import publish_weights
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import Url
from tasks.accounting import accumulate_part, acquire, already_stepped, scored_rows
from tasks.context import RunContext, Stopwatch
from tasks.grad_parts import grad_part
from tasks.order import parts_before
from tasks.refs import HandOverRef, StepRef, TrainRef
from tasks.worker import slots_of, state_of, store_of


def train_config(ctx: RunContext, agent: str) -> TrainConfig:
    return TrainConfig.from_agent(ctx.spec.agents[agent], seed=ctx.seed)


def trainer_factory(ctx: RunContext, agent: str) -> Any:
    """Build A's trainer on a slot device: from its latest checkpoint if the run has one."""

    def build(device: str) -> AgentTrainer:
        model = local_dir(ctx.spec.agents[agent].model)
        # a corrupt newest checkpoint is set aside and the previous one used; the steps it
        # held are then re-trained from the store (tasks.accounting)
        restored = restore_latest(ctx.checkpoint_root(agent), device=device, model_path=model)
        if restored is not None:
            return restored
        return AgentTrainer(agent, model, train_config(ctx, agent), device)

    return build


def accumulate_micro_batch(
    ctx: RunContext, agent: str, step: int, mb: int, after: tuple[Any, ...] = ()
) -> TrainRef:
    """`after`: what the task waited for; the rows come from its fused generates when they
    carry them (`GenRef.scored`), else from the store."""
    watch = Stopwatch("train_micro_batch", agent, step, mb)
    batch, segment_ids = scored_rows(ctx, agent, step, mb, after)

    def done(loss: float, how: str) -> TrainRef:
        return train_ref(agent, step, mb, batch, segment_ids, loss, watch, how)

    if already_stepped(ctx, agent, step) is not None:  # stepped before a kill
        return done(0.0, "held")
    slots = slots_of(ctx)
    # replays what it lost, and the micro-batches this one must follow
    trainer = acquire(ctx, agent, step, parts_before(mb), trainer_factory(ctx, agent))
    try:
        loss, how = 0.0, "held"
        if mb not in trainer.accumulated:  # a re-run after the step's kill already has it
            loss, how = take_part(ctx, trainer, agent, step, mb, batch, after)
    except BaseException:
        slots.forget(agent)  # partial gradients: the retry rebuilds from the store
        raise
    else:
        slots.release(agent)
    return done(loss, how)


def train_ref(
    agent: str,
    step: int,
    mb: int,
    batch: Any,
    segment_ids: tuple[str, ...],
    loss: float,
    watch: Stopwatch,
    how: str = "trained",
) -> TrainRef:
    """What accumulating micro-batch `mb` of `step` from `batch` returns (its rows' counts
    and versions are what the optimizer step checks and records; `how`: `TrainRef.how`)."""
    versions = batch.own_versions
    tokens = int(batch.response_lengths.sum())
    return TrainRef(
        agent, step, mb, segment_ids, versions, len(batch), tokens, loss, watch.done(), how
    )


def take_part(
    ctx: RunContext,
    trainer: AgentTrainer,
    agent: str,
    step: int,
    mb: int,
    batch: Any,
    after: tuple[Any, ...],
) -> tuple[float, str]:
    """Accumulate micro-batch `mb`: add the gradient a generate task in `after` computed for
    it where it fits the trainer (`tasks.grad_parts.grad_part`), else forward and backward
    here; its loss and how it went in ("added" or "trained", counted by the step)."""
    counts = (int(batch.response_lengths.sum()), len(batch))
    part = grad_part(after, agent, step, mb, trainer.version, counts)
    if part is None:
        return accumulate_part(ctx, trainer, agent, step, mb, batch), "trained"
    trainer.add_part(Accum.from_json(part.accum), part.grads)
    return float(part.accum["loss"]), "added"


def step_parts(ctx: RunContext, agent: str, step: int, parts: tuple[Any, ...]) -> StepRef:
    """The optimizer step of an agent that back-propagates on its rollout workers
    (`run.rollout_gradients`): `parts` are its generate tasks' refs, micro-batch j at j,
    each with the rows it scored and the gradient it computed. One task adds them in order
    (or trains a micro-batch here, from its rows, when its gradient does not fit) and steps:
    two task hops a micro-batch fewer than a train task each. The trainer is acquired and
    the store asked whether the step is already done once for all the parts."""
    if already_stepped(ctx, agent, step) is not None:  # stepped before a kill: its record
        return step_agent(ctx, agent, step, ())
    slots = slots_of(ctx)
    trainer = acquire(ctx, agent, step, 0, trainer_factory(ctx, agent))
    trains = []
    try:
        for j, ref in enumerate(parts):  # in order: every part's predecessors are in
            watch = Stopwatch("train_micro_batch", agent, step, j)
            batch, segment_ids = scored_rows(ctx, agent, step, j, (ref,))
            loss, how = 0.0, "held"
            if j not in trainer.accumulated:  # a re-run after the step's kill already has it
                loss, how = take_part(ctx, trainer, agent, step, j, batch, (ref,))
            trains.append(train_ref(agent, step, j, batch, segment_ids, loss, watch, how))
    except BaseException:
        slots.forget(agent)  # partial gradients: the retry rebuilds from the store
        raise
    else:
        slots.release(agent)
    return step_agent(ctx, agent, step, tuple(trains))


def step_agent(ctx: RunContext, agent: str, step: int, trains: tuple[TrainRef, ...]) -> StepRef:
    watch = Stopwatch("optimizer_step", agent, step)
    table = store_of(ctx).table(agent)
    logged = already_stepped(ctx, agent, step)
    if logged is not None:  # done before a kill: the checkpoint holds its result
        return StepRef(
            agent,
            step,
            int(logged["extra"]["version_after"]),
            False,
            float(logged["extra"].get("loss", 0.0)),
            0.0,
            True,
            watch.done(),
        )
    slots = slots_of(ctx)
    trainer = acquire(ctx, agent, step, len(trains), trainer_factory(ctx, agent))
    parts = dict(Counter(t.how for t in trains))
    try:
        version_before = trainer.version
        result = trainer.step(expect={t.micro_batch: (t.tokens, t.rows) for t in trains})
        t_publish = time.perf_counter()
        publish_weights(
            state_of(ctx), agent, result.version, trainer.weights(), meta=trainer.describe()
        )
        publish_s = time.perf_counter() - t_publish
        # the record first, the checkpoint second: a kill in between leaves a logged step
        # without its checkpoint, which is replayed from the store, never applied twice
        table.record_consumption(
            step,
            [s for t in trains for s in t.segment_ids],
            sorted({v for t in trains for v in t.versions}),
            extra={
                "version_before": version_before,
                "version_after": result.version,
                "skipped": result.skipped,
                "loss": result.loss,
                "grad_norm": result.grad_norm,
                "mode": ctx.mode,
                "staleness": ctx.staleness,
                "max_carry": ctx.spec.run.rollout.carry_limit,  # april widens the rule
                "rows": sum(t.rows for t in trains),
                "parts": parts,
                "trained": [[j, tok, seq] for j, (tok, seq) in sorted(result.parts.items())],
                # ratio, clip and IS diagnostics, the zero-advantage fraction skipped (finite
                # values only: the record is strict JSON)
                "metrics": {k: v for k, v in result.metrics.items() if math.isfinite(v)},
            },
        )
        if step == ctx.last_step:  # the final export is the last step's weights
            save_checkpoint(trainer, checkpoint_dir(ctx.checkpoint_root(agent), trainer.version))
            prune_checkpoints(ctx.checkpoint_root(agent), ctx.keep_checkpoints)
        elif ctx.checkpoint_every:
            maybe_checkpoint(
                trainer, ctx.checkpoint_root(agent), ctx.checkpoint_every, ctx.keep_checkpoints
            )
    except BaseException:
        slots.forget(agent)  # stepped but not persisted: the retry rebuilds and steps again
        raise
    else:
        slots.release(agent)
    return StepRef(
        agent,
        step,
        result.version,
        result.skipped,
        result.loss,
        result.grad_norm,
        False,
        watch.done(),
        publish_s,
        {k: v for k, v in result.metrics.items() if math.isfinite(v)},
        parts,
    )


def hand_over_agent(
    ctx: RunContext, agent: str, step: int, source: str, target: str
) -> HandOverRef:
    """Put A's training state where any worker finds it (the StateStore's root URL: shared
    by every worker, like the published weights) and drop it here. The target's first
    `acquire` loads it, and `catch_up` checks its version against the store as after any
    swap: a state that went missing or stale is rebuilt from the checkpoint, never trusted."""
    watch = Stopwatch("hand_over", agent, step)
    nbytes = slots_of(ctx).hand_over(agent, Url(""))
    timing = watch.done()
    return HandOverRef(agent, step, source, target, nbytes, timing)


@task(
    name="train_micro_batch",
    retries=1,
    persist_result=False,
    task_run_name="train_micro_batch {agent} k={step} mb={mb}",
)
def train_micro_batch(
    ctx: RunContext, agent: str, step: int, mb: int, after: tuple[Any, ...] = ()
) -> TrainRef:
    return accumulate_micro_batch(ctx, agent, step, mb, after)


@task(
    name="optimizer_step",
    retries=1,
    persist_result=False,
    task_run_name="optimizer_step {agent} k={step}",
)
def optimizer_step(
    ctx: RunContext,
    agent: str,
    step: int,
    trains: tuple[TrainRef, ...],
    after: tuple[Any, ...] = (),
    parts: tuple[Any, ...] = (),
) -> StepRef:
    """`parts`: the agent's generate refs when its micro-batches were back-propagated on the
    rollout workers (`step_parts`); then `trains` is empty."""
    if parts:
        return step_parts(ctx, agent, step, parts)
    return step_agent(ctx, agent, step, trains)


@task(
    name="hand_over",
    retries=1,
    persist_result=False,
    task_run_name="hand_over {agent} k={step}",
)
def hand_over(
    ctx: RunContext,
    agent: str,
    step: int,
    source: str,
    target: str,
    after: tuple[Any, ...] = (),
) -> HandOverRef:
    return hand_over_agent(ctx, agent, step, source, target)
