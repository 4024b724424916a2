"""The training tasks' bodies (`accumulate_micro_batch`, `step_agent`) and the exact step
accounting behind them (`tasks.accounting`), called directly on a tiny model.

A training worker that dies is simulated by dropping the run's SlotManager: the next task
builds a fresh trainer from the newest checkpoint, exactly as on a nanny-restarted worker.
Every interrupted run is compared with an uninterrupted run on identical rows."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

import tasks.training
from engines.training.publish import latest_published, weights_key
from engines.training.trainer import AgentTrainer, StepMismatchError
from storage.audit import audit_consistency
from storage.schema import SegmentKey
from storage.testing import synthetic_batch
from tasks.accounting import accumulate_part, already_stepped, read_scored
from tasks.context import RunContext
from tasks.grad_parts import gradient_part
from tasks.refs import StepRef
from tasks.training import (
    accumulate_micro_batch,
    step_agent,
    step_parts,
    train_config,
    trainer_factory,
)
from tasks.worker import slots_of, state_of, store_of
from tests.tasks.conftest import drop_trainers, write_scored

AGENT, NODE = "solver", "solve"
MBS = 2  # micro-batches per step


def published(ctx: RunContext, version: int) -> dict[str, torch.Tensor]:
    return state_of(ctx).get(weights_key(AGENT, version))[0]


def run_steps(
    ctx: RunContext, steps: int, drop_at: tuple[int, int] | None = None, start: int = 0
) -> list[StepRef]:
    """Write and train steps start..steps-1 of MBS micro-batches each. `drop_at=(k, j)`: the
    training worker restarts in step k before task j (j < MBS: train micro-batch j; j == MBS:
    the step task)."""
    out = []
    for k in range(start, steps):
        trains = []
        for j in range(MBS + 1):
            if drop_at == (k, j):
                drop_trainers(ctx)
            if j < MBS:
                write_scored(ctx, AGENT, NODE, k, j)
                trains.append(accumulate_micro_batch(ctx, AGENT, k, j))
        out.append(step_agent(ctx, AGENT, k, tuple(trains)))
    return out


def trained(ctx: RunContext, step: int) -> list[list[int]]:
    rec = store_of(ctx).table(AGENT).consumption(step)
    assert rec is not None, f"step {step} is not in the consumption log"
    return rec["extra"]["trained"]


def assert_same_run(
    got: RunContext, got_steps: list[StepRef], ref: RunContext, ref_steps: list[StepRef]
) -> None:
    """Same versions, losses, published weights and consumption records as the reference."""
    assert [s.version for s in got_steps] == [s.version for s in ref_steps]
    for g, r in zip(got_steps, ref_steps, strict=True):
        assert g.loss == pytest.approx(r.loss, rel=1e-6, abs=1e-9)
        assert g.grad_norm == pytest.approx(r.grad_norm, rel=1e-6)
    last = ref_steps[-1].version
    assert latest_published(state_of(got), AGENT) == last
    assert_close(published(got, last), published(ref, last), rtol=1e-6, atol=1e-7)
    for k in range(len(ref_steps)):
        assert trained(got, k) == trained(ref, k)
        assert [j for j, _, _ in trained(got, k)] == list(range(MBS))  # each once
    audit = audit_consistency(store_of(got))
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)


def test_step_records_exactly_what_was_trained_and_audits_clean(new_ctx) -> None:
    ctx = new_ctx()
    batches = [write_scored(ctx, AGENT, NODE, 0, j) for j in range(MBS)]
    trains = tuple(accumulate_micro_batch(ctx, AGENT, 0, j) for j in range(MBS))
    result = step_agent(ctx, AGENT, 0, trains)

    counted = [[j, int(b.response_lengths.sum()), len(b)] for j, b in enumerate(batches)]
    assert [[t.micro_batch, t.tokens, t.rows] for t in trains] == counted
    rec = store_of(ctx).table(AGENT).consumption(0)
    assert rec["segments"] == [SegmentKey(0, j, NODE).id for j in range(MBS)]
    assert rec["versions"] == [0]
    assert rec["extra"]["trained"] == counted
    assert rec["extra"]["rows"] == sum(len(b) for b in batches)
    assert (rec["extra"]["version_before"], rec["extra"]["version_after"]) == (0, 1)
    assert (result.version, result.skipped, result.resumed) == (1, False, False)
    assert rec["extra"]["parts"] == result.parts == {"trained": MBS}  # all on the trainer

    audit = audit_consistency(store_of(ctx))
    assert (audit.steps_checked, audit.rows_checked) == (1, sum(len(b) for b in batches))
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    assert audit.problems == ()

    assert latest_published(state_of(ctx), AGENT) == 1
    initial = AgentTrainer(AGENT, ctx.spec.agents[AGENT].model, train_config(ctx, AGENT)).weights()
    after = published(ctx, 1)
    assert after.keys() == initial.keys()
    assert any(not torch.equal(after[k], initial[k]) for k in initial)  # the step moved them


@pytest.mark.parametrize(
    "drop_at",
    [(0, 1), (0, MBS), (1, 1), (1, MBS)],
    ids=["k0-between-mbs", "k0-before-step", "k1-between-mbs", "k1-before-step"],
)
def test_worker_restart_within_a_step_gives_the_uninterrupted_result(
    new_ctx, drop_at: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    ref = new_ctx("ref")
    ref_steps = run_steps(ref, 2)
    ctx = new_ctx("restarted")
    with caplog.at_level(logging.WARNING, logger="tasks.accounting"):
        got_steps = run_steps(ctx, 2, drop_at=drop_at)
    k, j = drop_at
    lost = list(range(j))  # the micro-batches the dead worker had accumulated
    assert f"step {k} re-accumulated micro-batches {lost} from the store" in caplog.text
    assert "replayed" not in caplog.text  # checkpoint_every=1: nothing to replay
    assert_same_run(ctx, got_steps, ref, ref_steps)


@pytest.mark.parametrize("restart", [False, True], ids=["live", "worker-restarts-between"])
def test_micro_batch_1_may_train_before_0_with_the_same_weights_bit_for_bit(
    new_ctx, restart: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The pipeline lets a step's first two micro-batches train in the order they arrive
    (`parts_before`): 1 then 0 gives the run that 0 then 1 gives, to the bit, also when the
    training worker dies in between (0 then trains alone on the rebuilt trainer, and the
    step task re-accumulates 1 from the store)."""
    ref = new_ctx("ref")
    ref_steps = run_steps(ref, 2)
    ctx = new_ctx("reversed")
    got = []
    with caplog.at_level(logging.WARNING, logger="tasks.accounting"):
        for k in range(2):
            for j in range(MBS):
                write_scored(ctx, AGENT, NODE, k, j)
            second = accumulate_micro_batch(ctx, AGENT, k, 1)
            if restart:
                drop_trainers(ctx)
            first = accumulate_micro_batch(ctx, AGENT, k, 0)
            got.append(step_agent(ctx, AGENT, k, (first, second)))
    assert ("re-accumulated micro-batches [1]" in caplog.text) == restart
    assert_same_run(ctx, got, ref, ref_steps)
    mine, theirs = published(ctx, 2), published(ref, 2)
    assert all(torch.equal(mine[n], theirs[n]) for n in theirs)


def test_a_third_micro_batch_waits_for_the_first_two(
    new_ctx, caplog: pytest.LogCaptureFixture
) -> None:
    """From the third micro-batch on the order is fixed: a trainer that lost 0 and 1 (a
    restarted worker) re-accumulates both from the store before it trains 2."""
    ctx = new_ctx()
    for j in range(3):
        write_scored(ctx, AGENT, NODE, 0, j)
    accumulate_micro_batch(ctx, AGENT, 0, 1)
    drop_trainers(ctx)
    with caplog.at_level(logging.WARNING, logger="tasks.accounting"):
        accumulate_micro_batch(ctx, AGENT, 0, 2)
    assert "step 0 re-accumulated micro-batches [0, 1] from the store" in caplog.text
    trainer = slots_of(ctx).acquire(AGENT, trainer_factory(ctx, AGENT))
    assert sorted(trainer.accumulated) == [0, 1, 2]
    slots_of(ctx).release(AGENT)


@pytest.mark.parametrize(
    "drop_at, replayed",
    [((1, 1), [0]), ((3, 1), [2]), ((3, MBS), [2])],
    ids=["no-checkpoint-yet", "checkpoint-behind-mb", "checkpoint-behind-step-task"],
)
def test_rebuilt_trainer_replays_what_the_checkpoint_lacks(
    new_ctx, drop_at: tuple[int, int], replayed: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    # checkpoint_every=2: versions 2, 4, ... are checkpointed, so a trainer rebuilt in
    # step 1 starts from the model (version 0) and one rebuilt in step 3 from version 2
    ref = new_ctx("ref", checkpoint_every=2)
    ref_steps = run_steps(ref, 4)
    ctx = new_ctx("restarted", checkpoint_every=2)
    with caplog.at_level(logging.WARNING, logger="tasks.accounting"):
        got_steps = run_steps(ctx, 4, drop_at=drop_at)
    for s in replayed:
        assert f"replayed step {s} from the store (version {s + 1})" in caplog.text
    assert caplog.text.count("replayed step") == len(replayed)
    assert_same_run(ctx, got_steps, ref, ref_steps)


def test_logged_step_without_checkpoint_runs_again_and_rerecords_identically(new_ctx) -> None:
    """Killed between the consumption record and the checkpoint: the step task runs again
    on a rebuilt trainer, reaches the same version and weights, and the record is unchanged."""
    ref = new_ctx("ref", checkpoint_every=2)
    ref_steps = run_steps(ref, 1)
    ctx = new_ctx("killed", checkpoint_every=2)
    run_steps(ctx, 1)
    before = store_of(ctx).table(AGENT).consumption(0)
    assert already_stepped(ctx, AGENT, 0) is None  # version 1 is not checkpointed
    drop_trainers(ctx)
    trains = tuple(accumulate_micro_batch(ctx, AGENT, 0, j) for j in range(MBS))
    again = step_agent(ctx, AGENT, 0, trains)
    assert not again.resumed
    assert store_of(ctx).table(AGENT).consumption(0) == before
    assert_same_run(ctx, [again], ref, ref_steps)


def test_step_with_micro_batches_it_did_not_accumulate_is_refused(new_ctx) -> None:
    ctx = new_ctx()
    for j in range(MBS):
        write_scored(ctx, AGENT, NODE, 0, j)
    trains = tuple(accumulate_micro_batch(ctx, AGENT, 0, j) for j in range(MBS))
    table = store_of(ctx).table(AGENT)

    # a forged extra micro-batch 2 (nothing of it is in the store): the step task tries to
    # accumulate it from the store, which has no segment of it
    forged = replace(trains[-1], micro_batch=2, segment_ids=())
    with pytest.raises(RuntimeError, match="micro-batch 2: no committed segment"):
        step_agent(ctx, AGENT, 0, (*trains, forged))
    # a micro-batch whose counts differ from what the (rebuilt) trainer accumulated
    drop_trainers(ctx)
    wrong = replace(trains[-1], tokens=trains[-1].tokens + 1)
    with pytest.raises(StepMismatchError):
        step_agent(ctx, AGENT, 0, (trains[0], wrong))
    assert table.consumption(0) is None and table.consumption_log() == {}
    assert latest_published(state_of(ctx), AGENT) is None


def test_trainer_step_expect_refuses_a_partial_or_double_batch(new_ctx) -> None:
    ctx = new_ctx()
    batches = [write_scored(ctx, AGENT, NODE, 0, j) for j in range(MBS)]
    expect = {j: (int(b.response_lengths.sum()), len(b)) for j, b in enumerate(batches)}
    slots = slots_of(ctx)
    trainer = slots.acquire(AGENT, trainer_factory(ctx, AGENT))
    try:
        trainer.begin_step(step=0)
        accumulate_part(ctx, trainer, AGENT, 0, 0)
        with pytest.raises(StepMismatchError, match=r"missing \[1\]"):
            trainer.step(expect=expect)
        assert trainer.accumulated == {0: expect[0]}  # left untouched
        with pytest.raises(StepMismatchError, match="already accumulated"):
            accumulate_part(ctx, trainer, AGENT, 0, 0)
        assert trainer.accumulated == {0: expect[0]}
        accumulate_part(ctx, trainer, AGENT, 0, 1)
        with pytest.raises(StepMismatchError, match=r"unexpected \[1\]"):
            trainer.step(expect={0: expect[0]})
        assert trainer.version == 0
        assert trainer.step(expect=expect).version == 1
    finally:
        slots.release(AGENT)
    assert store_of(ctx).table(AGENT).consumption_log() == {}


def test_read_scored_refuses_unscored_rows_naming_agent_step_and_micro_batch(new_ctx) -> None:
    ctx = new_ctx()
    write_scored(ctx, AGENT, NODE, 0, 0)
    batch, segments = read_scored(ctx, AGENT, 0, 0)
    assert segments == (SegmentKey(0, 0, NODE).id,) and len(batch) == 4

    key = SegmentKey(0, 1, NODE)
    unscored = synthetic_batch(key, groups=2, group_size=2, prompt_len=6, response_len=5, vocab=500)
    store_of(ctx).table(AGENT).write_segment(key, unscored)
    with pytest.raises(
        RuntimeError, match=r"agent 'solver' step 0 micro-batch 1: .*not all scored"
    ):
        read_scored(ctx, AGENT, 0, 1)
    with pytest.raises(RuntimeError, match=r"agent 'solver' step 0 micro-batch 1"):
        accumulate_micro_batch(ctx, AGENT, 0, 1)


def test_already_stepped_needs_the_checkpoint_too(new_ctx) -> None:
    ctx = new_ctx(checkpoint_every=2)
    table = store_of(ctx).table(AGENT)
    run_steps(ctx, 1)
    assert table.consumption(0) is not None
    assert already_stepped(ctx, AGENT, 0) is None  # logged, but version 1 is not checkpointed
    run_steps(ctx, 2, start=1)
    assert already_stepped(ctx, AGENT, 0) == table.consumption(0)  # checkpoint v2 holds both
    assert already_stepped(ctx, AGENT, 1) == table.consumption(1)
    assert already_stepped(ctx, AGENT, 2) is None  # not logged

    # tasks of a finished step (a resumed run) touch nothing
    trainer = slots_of(ctx).acquire(AGENT, trainer_factory(ctx, AGENT))
    slots_of(ctx).release(AGENT)
    again = accumulate_micro_batch(ctx, AGENT, 1, 0)
    assert again.loss == 0.0 and not trainer.pending
    resumed = step_agent(ctx, AGENT, 1, (again, accumulate_micro_batch(ctx, AGENT, 1, 1)))
    assert (resumed.version, resumed.resumed) == (2, True)
    assert trainer.version == 2 and latest_published(state_of(ctx), AGENT) == 2


@pytest.mark.parametrize("failing", ["publish_weights", "maybe_checkpoint"])
def test_step_task_retry_after_a_transient_failure_on_a_live_worker(
    new_ctx, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """Publishing or checkpointing fails once after `trainer.step()` on a live worker: the
    task's retry must still reach the uninterrupted result (never refuse the trainer it left
    one version ahead, never step twice)."""
    ref = new_ctx("ref")
    ref_steps = run_steps(ref, 2)
    ctx = new_ctx("flaky")
    first = run_steps(ctx, 1)
    for j in range(MBS):
        write_scored(ctx, AGENT, NODE, 1, j)
    trains = tuple(accumulate_micro_batch(ctx, AGENT, 1, j) for j in range(MBS))
    real, calls = getattr(tasks.training, failing), []

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("transient write error")
        return real(*args, **kwargs)

    monkeypatch.setattr(tasks.training, failing, once)
    with pytest.raises(OSError, match="transient"):
        step_agent(ctx, AGENT, 1, trains)
    again = step_agent(ctx, AGENT, 1, trains)  # Prefect's retry (retries=1), same worker
    assert_same_run(ctx, [*first, again], ref, ref_steps)


def test_train_task_retry_after_a_failure_inside_backward(new_ctx) -> None:
    """A backward that dies half-way (an OOM) leaves part of the micro-batch's gradient in the
    pending step; the retry on the same worker must not count that part twice."""
    ref = new_ctx("ref")
    ref_steps = run_steps(ref, 1)
    ctx = new_ctx("oom")
    for j in range(MBS):
        write_scored(ctx, AGENT, NODE, 0, j)
    t0 = accumulate_micro_batch(ctx, AGENT, 0, 0)
    trainer = slots_of(ctx).acquire(AGENT, trainer_factory(ctx, AGENT))
    slots_of(ctx).release(AGENT)
    fired = []

    def oom(grad: torch.Tensor) -> None:  # backward dies half-way: later layers' grads added
        fired.append(1)
        raise RuntimeError("CUDA out of memory (simulated)")

    first_layer = trainer.model.model.layers[0].self_attn.q_proj.weight
    hook = first_layer.register_hook(oom)
    with pytest.raises(RuntimeError, match="out of memory"):
        accumulate_micro_batch(ctx, AGENT, 0, 1)
    hook.remove()
    assert fired and trainer.accumulated.keys() == {0}
    t1 = accumulate_micro_batch(ctx, AGENT, 0, 1)  # Prefect's retry, same worker
    got = step_agent(ctx, AGENT, 0, (t0, t1))
    assert_same_run(ctx, [got], ref, ref_steps)


def test_read_scored_refuses_a_micro_batch_with_no_committed_segment(new_ctx) -> None:
    """A missing segment is not an empty micro-batch: training it would step on part of
    the batch."""
    ctx = new_ctx()
    write_scored(ctx, AGENT, NODE, 0, 0)
    with pytest.raises(RuntimeError, match=r"step 0 micro-batch 1: no committed segment .*solve"):
        read_scored(ctx, AGENT, 0, 1)


def test_trainer_ahead_of_the_store_is_rebuilt_not_trained_on(
    new_ctx, caplog: pytest.LogCaptureFixture
) -> None:
    """A run killed between its optimizer step and the consumption record, resumed onto the
    same live cluster: the resident trainer holds a version the store never recorded. The
    next task rebuilds it from the checkpoint and the run equals an uninterrupted one."""
    ref = new_ctx("ref")
    ref_steps = run_steps(ref, 2)
    ctx = new_ctx("resumed")
    first = run_steps(ctx, 1)
    slots = slots_of(ctx)
    trainer = slots.acquire(AGENT, trainer_factory(ctx, AGENT))
    trainer.begin_step(step=1)
    accumulate_part(ctx, trainer, AGENT, 1, 0, write_scored(ctx, AGENT, NODE, 1, 0))
    trainer.step()  # in memory only: version 2, never published nor recorded
    slots.release(AGENT)
    assert trainer.version == 2
    with caplog.at_level(logging.WARNING, logger="tasks.accounting"):
        rest = run_steps(ctx, 2, start=1)
    assert "resident trainer is ahead of the store; rebuilding it" in caplog.text
    assert_same_run(ctx, first + rest, ref, ref_steps)


def test_rollout_gradient_parts_are_counted_added_or_refused_and_recomputed(new_ctx) -> None:
    """`step_parts` adds a part computed at the trainer's version over its rows and
    recomputes one that is not (here: computed at another version); the step says which,
    and the result equals the step trained entirely on the trainer."""
    ctx, ref = new_ctx("parts"), new_ctx("reference")
    for c in (ctx, ref):
        for j in range(MBS):
            write_scored(c, AGENT, NODE, 0, j)
    batches = [read_scored(ctx, AGENT, 0, j)[0] for j in range(MBS)]
    good = gradient_part(ctx, AGENT, 0, 0, 0, batches[0])
    stale = replace(gradient_part(ctx, AGENT, 0, 1, 0, batches[1]), version=7)
    refs = tuple(SimpleNamespace(grad=p) for p in (good, stale))
    got = step_parts(ctx, AGENT, 0, refs)
    assert got.parts == {"added": 1, "trained": 1}
    assert store_of(ctx).table(AGENT).consumption(0)["extra"]["parts"] == got.parts

    trains = tuple(accumulate_micro_batch(ref, AGENT, 0, j) for j in range(MBS))
    want = step_agent(ref, AGENT, 0, trains)
    assert want.parts == {"trained": MBS}
    assert got.loss == pytest.approx(want.loss, rel=1e-5)
    assert_close(published(ctx, 1), published(ref, 1), rtol=1e-5, atol=1e-6)
