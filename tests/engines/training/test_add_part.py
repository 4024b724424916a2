"""AgentTrainer.add_part: a micro-batch back-propagated on another trainer at the same version
(a rollout worker's copy, `tasks.grad_parts`) adds up to what accumulating it here gives."""

from __future__ import annotations

import pytest
import torch

from engines.training.accum import Accum
from engines.training.train_config import StepMismatchError
from engines.training.trainer import AgentTrainer, TrainConfig
from tests.engines.training.training_helpers import merge, random_batch


def _part(replica: AgentTrainer, step: int, mb: int, batch: object) -> tuple[Accum, dict]:
    """What a rollout worker ships: the part's accounting and its gradients (numpy)."""
    replica.begin_step(step=step)
    replica.accumulate(batch, part=mb)  # type: ignore[arg-type]
    acc = replica.pending_accum()
    assert acc is not None
    grads = {
        n: p.grad.numpy().copy() for p, n in replica.policy.trainable.items() if p.grad is not None
    }
    for p in replica.policy.trainable:
        p.grad = None
    replica.set_pending(None)
    return Accum.from_json(acc.to_json()), grads


def test_parts_from_a_replica_step_like_accumulating_here(tiny_model: str) -> None:
    cfg = TrainConfig(lr=1e-2, kl_coef=0.0, seed=3)
    here = AgentTrainer("a", tiny_model, cfg)
    fused = AgentTrainer("a", tiny_model, cfg)
    replica = AgentTrainer("a", tiny_model, cfg)
    init = {k: v.clone() for k, v in here.weights().items()}
    for step in range(3):
        samples = random_batch(seed=step, n=8)
        mbs = [merge(samples[:4]), merge(samples[4:])]
        here.begin_step(step=step)
        for j, mb in enumerate(mbs):
            here.accumulate(mb, part=j)
        fused.begin_step(step=step)
        replica.policy.assign(fused.weights())  # what the rollout worker loads: the published
        replica.version = fused.version
        fused.accumulate(mbs[0], part=0)  # one part here, one from the replica: either mix
        fused.add_part(*_part(replica, step, 1, mbs[1]))
        r_here, r_fused = here.step(), fused.step()
        assert (r_fused.version, r_fused.num_tokens, r_fused.num_seqs, r_fused.parts) == (
            r_here.version,
            r_here.num_tokens,
            r_here.num_seqs,
            r_here.parts,
        )
        assert r_fused.loss == r_here.loss and r_fused.grad_norm == r_here.grad_norm
        assert r_fused.metrics == r_here.metrics
    moved = max(float((here.weights()[k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-3  # three steps that did something
    for k, w in here.weights().items():  # one process, one thread count: the same bits
        assert torch.equal(fused.weights()[k], w), k


def test_a_part_already_held_or_of_unknown_weights_is_refused(tiny_model: str) -> None:
    cfg = TrainConfig(lr=1e-2, kl_coef=0.0)
    trainer = AgentTrainer("a", tiny_model, cfg)
    replica = AgentTrainer("a", tiny_model, cfg)
    mb = merge(random_batch(seed=5, n=4))
    with pytest.raises(RuntimeError, match="before begin_step"):
        trainer.add_part(*_part(replica, 0, 0, mb))
    trainer.begin_step(step=0)
    trainer.accumulate(mb, part=0)
    before = {n: p.grad.clone() for p, n in trainer.policy.trainable.items() if p.grad is not None}
    acc, grads = _part(replica, 0, 0, mb)
    with pytest.raises(StepMismatchError, match="already accumulated"):
        trainer.add_part(acc, grads)
    after = {n: p.grad for p, n in trainer.policy.trainable.items() if p.grad is not None}
    assert all(torch.equal(after[n], g) for n, g in before.items())  # nothing was added
    acc, grads = _part(replica, 0, 1, mb)
    with pytest.raises(ValueError, match="unknown parameters"):
        trainer.add_part(acc, {**grads, "not.a.weight": next(iter(grads.values()))})
    assert 1 not in trainer.accumulated  # refused whole


def test_accum_add_sums_every_count() -> None:
    acc = Accum(None, None, step=4)
    acc.record("a", 0, 10, 2)
    acc.loss, acc.tokens, acc.seqs, acc.metrics = 1.5, 10, 2, {"clip": 0.5}
    other = Accum(None, None, step=4, loss=0.25, finite=False, tokens=7, seqs=3)
    other.record("a", 1, 7, 3)
    other.metrics, other.skipped_tokens, other.skipped_seqs, other.echo_tokens = (
        {"clip": 1.0, "kl": 2.0},
        4,
        1,
        2,
    )
    acc.add("a", other)
    assert acc.parts == {0: (10, 2), 1: (7, 3)}
    assert (acc.loss, acc.finite, acc.tokens, acc.seqs) == (1.75, False, 17, 5)
    assert (acc.skipped_tokens, acc.skipped_seqs, acc.echo_tokens) == (4, 1, 2)
    assert acc.metrics == {"clip": 1.5, "kl": 2.0}
    with pytest.raises(StepMismatchError):
        acc.add("a", other)  # part 1 twice
