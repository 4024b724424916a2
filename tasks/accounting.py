"""Exact step accounting for the training tasks: which rows a step holds, and rebuilding a
trainer that lost them.

A trainer lives in one training worker's memory. When that worker dies (OOM, SIGKILL, a
preempted node), the nanny restarts it and the pinned train task runs again there, on a
trainer built from the newest checkpoint. Training the remaining micro-batches onto that
fresh trainer would step on a partial batch (and, with `checkpoint_every > 1`, from older
weights). `catch_up` prevents both, from the store alone:

1. *Replay*: while the trainer's version is behind the version this step must start from
   (the previous step's `version_after` in the consumption log), re-train each logged step
   from exactly the segments it recorded, and check the version it reaches.
2. *Re-accumulate*: open the step (`begin_step(step=k)`) and accumulate every earlier
   micro-batch of the step that the trainer does not hold, from its committed, scored rows.

Then `step(expect=...)` refuses anything but the step's full set of micro-batches, and the
consumption record lists what the trainer really accumulated (`trained`), which
`storage.audit` checks against the rows of the recorded segments.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from engines.training.batch import build_microbatch
from engines.training.checkpoint_index import latest_checkpoint
from engines.training.echo import echo_clips
from engines.training.trainer import AgentTrainer
from storage.schema import SampleBatch, SegmentKey
from tasks.context import RunContext
from tasks.refs import GenRef
from tasks.worker import slots_of, store_of, tokenizer_of

log = logging.getLogger(__name__)


class StaleTrainerError(RuntimeError):
    """The resident trainer is ahead of the step: it stepped in memory past what the store
    recorded (a run killed between its optimizer step and its consumption record, then
    resumed onto the same live cluster). It must be rebuilt from the checkpoint."""


def acquire(ctx: RunContext, agent: str, step: int, upto: int, build: Any) -> AgentTrainer:
    """A's trainer from this worker's slots, holding step `step` open with micro-batches
    0..upto-1 accumulated; a trainer ahead of the store is forgotten and rebuilt once."""
    slots = slots_of(ctx)
    for attempt in (0, 1):
        trainer = slots.acquire(agent, build)
        try:
            catch_up(ctx, trainer, agent, step, upto)
        except StaleTrainerError:
            slots.forget(agent)
            if attempt:
                raise
            log.warning("%s: resident trainer is ahead of the store; rebuilding it", agent)
        except BaseException:
            slots.forget(agent)  # partial gradients: the retry rebuilds from the store
            raise
        else:
            return trainer
    raise AssertionError("unreachable")


def read_scored(
    ctx: RunContext, agent: str, step: int, mb: int
) -> tuple[SampleBatch, tuple[str, ...]]:
    """A's committed, scored rows of (step, micro-batch) and their segment ids.

    Every node of A commits a segment in every micro-batch (possibly with no rows), so a
    missing one is an error: treating it as empty would train a partial batch."""
    table = store_of(ctx).table(agent)
    nodes = ctx.nodes_of(agent)
    found = {n: table.has_segment(SegmentKey(step, mb, n)) for n in nodes}
    missing = [n for n, i in found.items() if i is None]
    if missing:
        raise RuntimeError(
            f"agent {agent!r} step {step} micro-batch {mb}: no committed segment of node(s) "
            f"{missing} in the store; the micro-batch cannot be trained before its rollout"
        )
    infos = [i for i in found.values() if i is not None]
    # tool rows and skipped invocations are stored with the agent's, never trained
    batch = table.read(segments=[i.segment_id for i in infos]).trainable()
    _check_scored(batch, agent, step, mb)
    return batch, tuple(i.segment_id for i in infos)


def scored_rows(
    ctx: RunContext, agent: str, step: int, mb: int, after: tuple[Any, ...] = ()
) -> tuple[SampleBatch, tuple[str, ...]]:
    """A's scored rows of (step, micro-batch) and their segment ids: as the fused generate
    tasks in `after` handed them over (`GenRef.scored`) when they cover every node of A,
    else read from the store (`read_scored`). Both are the committed rows and scores."""
    held = {
        r.node: (r.scored, r.segment.segment_id)
        for r in after
        if isinstance(r, GenRef)
        and r.scored is not None
        and (r.agent, r.step, r.micro_batch) == (agent, step, mb)
    }
    nodes = ctx.nodes_of(agent)
    if set(held) != set(nodes):
        return read_scored(ctx, agent, step, mb)
    parts = [held[n][0] for n in nodes]
    batch = parts[0] if len(parts) == 1 else SampleBatch.concat(parts)
    _check_scored(batch, agent, step, mb)
    return batch, tuple(held[n][1] for n in nodes)


def _check_scored(batch: SampleBatch, agent: str, step: int, mb: int) -> None:
    if len(batch) and not np.all(np.isfinite(batch.advantage)):
        raise RuntimeError(f"agent {agent!r} step {step} micro-batch {mb}: rows are not all scored")


def already_stepped(ctx: RunContext, agent: str, step: int) -> dict[str, Any] | None:
    """The consumption record of (agent, step) if that step's result is also checkpointed.

    A logged step whose checkpoint was lost (checkpoint_every > 1, a write that failed on a
    full disk, or a corrupt checkpoint that `latest_checkpoint` set aside) must run again
    from the older checkpoint; re-recording the same segments and versions is then a no-op.
    "Checkpointed" means the newest checkpoint that passes its digest: the one a rebuilt
    trainer is restored from (`restore_latest`), so the two never disagree."""
    logged = store_of(ctx).table(agent).consumption(step)
    if logged is None:
        return None
    ckpt = latest_checkpoint(ctx.checkpoint_root(agent))
    have = int(ckpt.rstrip("/").rsplit("/v", 1)[1]) if ckpt else 0
    return logged if have >= int(logged["extra"]["version_after"]) else None


def version_before(ctx: RunContext, agent: str, step: int) -> int:
    """The policy version A's step `step` starts from: the previous step's result."""
    if step == 0:
        return 0
    rec = store_of(ctx).table(agent).consumption(step - 1)
    if rec is None:
        raise RuntimeError(
            f"agent {agent!r}: step {step} cannot start, step {step - 1} is not in the "
            "consumption log (the optimizer-step task must finish first)"
        )
    return int(rec["extra"]["version_after"])


def accumulate_part(
    ctx: RunContext,
    trainer: AgentTrainer,
    agent: str,
    step: int,
    mb: int,
    batch: SampleBatch | None = None,
) -> float:
    """Accumulate micro-batch `mb` of `step` (read from the store unless given); its loss."""
    if batch is None:
        batch, _ = read_scored(ctx, agent, step, mb)
    n = len(batch)
    if n == 0:
        trainer.accumulate_empty(mb)
        return 0.0
    pad = tokenizer_of(ctx, agent).pad_token_id or 0
    mbt = build_microbatch(
        [batch.prompt(i).tolist() for i in range(n)],
        [batch.response(i).tolist() for i in range(n)],
        [batch.logprob(i).tolist() for i in range(n)],
        batch.advantage.tolist(),
        pad,
        echo_lengths=echo_lengths(ctx, agent, batch),
        external=batch.external.tolist(),
    )
    return trainer.accumulate(mbt, part=mb)["loss"]


def echo_lengths(ctx: RunContext, agent: str, batch: SampleBatch) -> list[int] | None:
    """EchoRL's clip length per row of a scored batch (`engines.training.echo`), or None when
    the agent has no `loss.echo`. A token ends a step when its own text contains the
    delimiter (decoded one id at a time: what the tokenizer prints for that token)."""
    spec = ctx.spec.agents[agent].loss.echo
    if spec is None:
        return None
    tok = tokenizer_of(ctx, agent)
    responses = [batch.response(i) for i in range(len(batch))]
    ids = np.unique(np.concatenate(responses)) if responses else np.zeros(0, np.int64)
    ends_step = {int(t) for t in ids if spec.delimiter in tok.decode([int(t)])}
    clips = echo_clips(
        batch.group_id,
        np.where(batch.score_status == "ok", batch.reward, np.nan),  # failed/dropped: never
        batch.advantage,
        [-batch.logprob(i) for i in range(len(batch))],
        [np.isin(r, list(ends_step)) for r in responses],
        spec.success,
    )
    return [int(c) for c in clips]


def replay(ctx: RunContext, trainer: AgentTrainer, agent: str, step: int, want: int) -> None:
    """Re-train A's logged steps before `step` until the trainer holds version `want`."""
    table = store_of(ctx).table(agent)
    for s, rec in table.consumption_log().items():
        extra = rec["extra"]
        if s >= step or trainer.version >= want:
            break
        if int(extra["version_after"]) <= trainer.version:
            continue
        if int(extra["version_before"]) != trainer.version:
            raise RuntimeError(
                f"agent {agent!r}: cannot replay step {s}: it started from version "
                f"{extra['version_before']}, the rebuilt trainer holds {trainer.version}"
            )
        trainer.begin_step(step=s)
        for j, _, _ in extra["trained"]:
            batch, segments = read_scored(ctx, agent, s, j)
            recorded = {x for x in rec["segments"] if SegmentKey.parse(x).micro_batch == j}
            if set(segments) != recorded:
                raise RuntimeError(
                    f"agent {agent!r} step {s} micro-batch {j}: the store holds segments "
                    f"{sorted(segments)}, the consumption log recorded {sorted(recorded)}"
                )
            accumulate_part(ctx, trainer, agent, s, j, batch)
        result = trainer.step(expect={j: (t, q) for j, t, q in extra["trained"]})
        if result.version != int(extra["version_after"]):
            raise RuntimeError(
                f"agent {agent!r}: replaying step {s} reached version {result.version}, the "
                f"log recorded {extra['version_after']}"
            )
        log.warning("%s: replayed step %d from the store (version %d)", agent, s, result.version)
    if trainer.version != want:
        raise RuntimeError(
            f"agent {agent!r}: step {step} needs version {want}; rebuilding reached "
            f"{trainer.version} (are the consumption records before step {step} complete?)"
        )


def catch_up(ctx: RunContext, trainer: AgentTrainer, agent: str, step: int, upto: int) -> None:
    """Make `trainer` hold step `step` open with micro-batches 0..upto-1 accumulated,
    replaying and re-accumulating from the store whatever it lost (module docstring)."""
    want = version_before(ctx, agent, step)
    if trainer.version > want:
        raise StaleTrainerError(
            f"agent {agent!r}: the trainer holds version {trainer.version}, but step {step} "
            f"must start from version {want}; refusing to train on top of a later policy"
        )
    if trainer.version < want:
        replay(ctx, trainer, agent, step, want)
    if trainer.pending_step != step:
        trainer.begin_step(step=step)
    missing = [j for j in range(upto) if j not in trainer.accumulated]
    for j in missing:
        accumulate_part(ctx, trainer, agent, step, j)
    if missing:
        log.warning(
            "%s: step %d re-accumulated micro-batches %s from the store", agent, step, missing
        )
