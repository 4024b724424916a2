"""Training tasks: accumulate one micro-batch, then one optimizer step + publication.

`train_micro_batch(A, k, j)` binds agent A to a training slot on this worker (the slot
manager swaps the least-recently-used agent out through the StateStore if none is free),
reads A's scored rows of (k, j) from the store, and accumulates gradients. Pending gradients
are part of the swapped state, so another agent may use the slot between two micro-batches.
`optimizer_step(A, k)` steps once, publishes version k+1 for the rollout hosts, checkpoints,
and writes the consumption log that makes the consistency rule auditable from the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from prefect import task

from engines.training.batch import build_microbatch
from engines.training.checkpoint import latest_checkpoint, maybe_checkpoint, restore_trainer
from engines.training.publish import publish_weights
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.schema import SampleBatch, SegmentKey
from tasks.context import RunContext, Stopwatch, Timing
from tasks.worker import slots_of, state_of, store_of, tokenizer_of


@dataclass(frozen=True, slots=True)
class TrainRef:
    agent: str
    step: int
    micro_batch: int
    segment_ids: tuple[str, ...]
    versions: tuple[int, ...]
    rows: int
    tokens: int
    loss: float
    timing: Timing


@dataclass(frozen=True, slots=True)
class StepRef:
    agent: str
    step: int
    version: int  # policy version after the step (= the one just published)
    skipped: bool
    loss: float
    grad_norm: float
    resumed: bool
    timing: Timing


def train_config(ctx: RunContext, agent: str) -> TrainConfig:
    a = ctx.spec.agents[agent]
    return TrainConfig(
        lr=a.optim.lr,
        betas=a.optim.betas,
        weight_decay=a.optim.weight_decay,
        grad_clip=a.optim.grad_clip,
        advantage=a.loss.advantage,
        policy_loss=a.loss.policy_loss,
        aggregation=a.loss.aggregation,
        clip_eps=a.loss.clip_eps,
        kl_coef=a.loss.kl_coef,
        seed=ctx.seed,
    )


def trainer_factory(ctx: RunContext, agent: str) -> Any:
    """Build A's trainer on a slot device: from its latest checkpoint if the run has one."""

    def build(device: str) -> AgentTrainer:
        ckpt = latest_checkpoint(ctx.checkpoint_root(agent))
        model = ctx.spec.agents[agent].model.removeprefix("hf://")
        if ckpt is not None:
            return restore_trainer(ckpt, device=device, model_path=model)
        return AgentTrainer(agent, model, train_config(ctx, agent), device)

    return build


def nodes_of(ctx: RunContext, agent: str) -> list[str]:
    return [n for n, spec in ctx.spec.nodes.items() if spec.agent == agent]


def read_scored(
    ctx: RunContext, agent: str, step: int, mb: int
) -> tuple[SampleBatch, tuple[str, ...]]:
    table = store_of(ctx).table(agent)
    found = (table.has_segment(SegmentKey(step, mb, n)) for n in nodes_of(ctx, agent))
    infos = [i for i in found if i is not None]
    batch = table.read(segments=[i.segment_id for i in infos])
    if len(batch) and not np.all(np.isfinite(batch.advantage)):
        raise RuntimeError(f"agent {agent!r} step {step} micro-batch {mb}: rows are not all scored")
    return batch, tuple(i.segment_id for i in infos)


def already_stepped(ctx: RunContext, agent: str, step: int) -> dict[str, Any] | None:
    """The consumption record of (agent, step) if that step's result is also checkpointed.

    A logged step whose checkpoint was lost (checkpoint_every > 1) must run again from the
    older checkpoint; re-recording the same segments and versions is then a no-op."""
    logged = store_of(ctx).table(agent).consumption(step)
    if logged is None:
        return None
    ckpt = latest_checkpoint(ctx.checkpoint_root(agent))
    have = int(ckpt.rstrip("/").rsplit("/v", 1)[1]) if ckpt else 0
    return logged if have >= int(logged["extra"]["version_after"]) else None


def train_micro_batch(ctx: RunContext, agent: str, step: int, mb: int) -> TrainRef:
    watch = Stopwatch("train", agent, step, mb)
    batch, segment_ids = read_scored(ctx, agent, step, mb)
    versions = tuple(int(v) for v in np.unique(batch.policy_version))

    def done(loss: float) -> TrainRef:
        tokens = int(batch.response_lengths.sum())
        return TrainRef(
            agent, step, mb, segment_ids, versions, len(batch), tokens, loss, watch.done()
        )

    if already_stepped(ctx, agent, step) is not None:  # stepped before a kill
        return done(0.0)
    slots = slots_of(ctx)
    trainer = slots.acquire(agent, trainer_factory(ctx, agent))
    try:
        if not trainer.pending:
            trainer.begin_step()  # normalisers are taken at step(): micro-batches stream in
        loss = 0.0
        if len(batch):
            pad = tokenizer_of(ctx, agent).pad_token_id or 0
            n = len(batch)
            mbt = build_microbatch(
                [batch.prompt(i).tolist() for i in range(n)],
                [batch.response(i).tolist() for i in range(n)],
                [batch.logprob(i).tolist() for i in range(n)],
                batch.advantage.tolist(),
                pad,
            )
            loss = trainer.accumulate(mbt)["loss"]
    finally:
        slots.release(agent)
    return done(loss)


def step_agent(ctx: RunContext, agent: str, step: int, trains: tuple[TrainRef, ...]) -> StepRef:
    watch = Stopwatch("step", agent, step)
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
    trainer = slots.acquire(agent, trainer_factory(ctx, agent))
    try:
        version_before = trainer.version
        result = trainer.step()
        publish_weights(state_of(ctx), agent, result.version, trainer.weights())
        if ctx.checkpoint_every:
            maybe_checkpoint(
                trainer, ctx.checkpoint_root(agent), ctx.checkpoint_every, ctx.keep_checkpoints
            )
    finally:
        slots.release(agent)
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
            "rows": sum(t.rows for t in trains),
        },
    )
    return StepRef(
        agent,
        step,
        result.version,
        result.skipped,
        result.loss,
        result.grad_norm,
        False,
        watch.done(),
    )


@task(
    name="train-micro-batch",
    retries=1,
    persist_result=False,
    task_run_name="train {agent} k={step} mb={mb}",
)
def train(ctx: RunContext, agent: str, step: int, mb: int, after: tuple[Any, ...] = ()) -> TrainRef:
    return train_micro_batch(ctx, agent, step, mb)


@task(name="optimizer-step", retries=1, persist_result=False, task_run_name="step {agent} k={step}")
def optimizer_step(
    ctx: RunContext,
    agent: str,
    step: int,
    trains: tuple[TrainRef, ...],
    after: tuple[Any, ...] = (),
) -> StepRef:
    return step_agent(ctx, agent, step, trains)
