"""Elastic training allocation as a pure policy: measured seconds in, one unit's move out,
kept or undone by the measured step interval."""

from __future__ import annotations

import pytest

from engines.training.allocation import (
    AllocatorConfig,
    ElasticAllocator,
    FixedAllocation,
    Move,
    best_move,
    round_robin,
)

UNITS = ["planner", "solver", "critic"]
TRAIN, ROLLOUT = "train0", "rollout0"
TRAIN_S = {"planner": 1.0, "solver": 6.0, "critic": 2.0}  # training seconds per step
ROLLOUT_S = 4.0  # the rollout worker's seconds per step


class World:
    """Steps run one after another; a step's interval is its busiest worker's seconds (a
    worker runs one task at a time), plus `extra` where a test says placement hurts."""

    def __init__(self, alloc: ElasticAllocator, extra: dict[str, float] | None = None) -> None:
        self.alloc, self.extra, self.clock, self.step = alloc, extra or {}, 0.0, 0
        self.placed: list[dict[str, str]] = []

    def run(self, steps: int) -> list[Move]:
        moves = []
        for _ in range(steps):
            k, self.step = self.step, self.step + 1
            where = {u: self.alloc.worker_of(u, k) for u in UNITS}
            self.placed.append(where)
            busy = {TRAIN: 0.0, ROLLOUT: ROLLOUT_S}
            self.alloc.observe(ROLLOUT, None, ROLLOUT_S, k)
            for u, w in where.items():
                self.alloc.observe(w, u, TRAIN_S[u], k)
                busy[w] += TRAIN_S[u]
            self.clock += max(busy.values()) + sum(self.extra.get(w, 0.0) for w in where.values())
            move = self.alloc.end_step(k, self.clock)
            if move is not None:
                moves.append(move)
        return moves


def test_fixed_allocation_is_round_robin_and_never_moves() -> None:
    fixed = FixedAllocation(UNITS, ["t0", "t1"])
    assert [fixed.worker_of(u, 5) for u in UNITS] == ["t0", "t1", "t0"]
    fixed.observe("t0", "planner", 100.0, 3)
    assert fixed.end_step(3, 10.0) is None
    with pytest.raises(ValueError, match="at least one training worker"):
        round_robin(UNITS, [])


def test_best_move_lowers_the_busiest_worker_and_respects_refusals() -> None:
    assignment = {"planner": TRAIN, "solver": TRAIN, "critic": TRAIN}
    load = {TRAIN: 9.0, ROLLOUT: 4.0}
    move, peak = best_move(assignment, load, TRAIN_S, [TRAIN, ROLLOUT], set()) or (None, 0)
    # critic (2 s) to the rollout worker: 7 / 6; planner: 8 / 5; solver: 3 / 10
    assert move == Move("critic", TRAIN, ROLLOUT) and peak == pytest.approx(7.0)
    refused = {("critic", ROLLOUT)}
    move, peak = best_move(assignment, load, TRAIN_S, [TRAIN, ROLLOUT], refused) or (None, 0)
    assert move == Move("planner", TRAIN, ROLLOUT) and peak == pytest.approx(8.0)


def test_idle_rollout_capacity_takes_a_light_agents_training() -> None:
    alloc = ElasticAllocator(UNITS, [TRAIN], [ROLLOUT])
    world = World(alloc)
    moves = world.run(8)
    assert moves == [Move("critic", TRAIN, ROLLOUT)]  # 9 s → 7 s on the training worker
    first = next(k for k, p in enumerate(world.placed) if p["critic"] == ROLLOUT)
    assert first >= 2  # step 0 is warm-up, step 1 gives the first interval
    assert all(p["critic"] == ROLLOUT for p in world.placed[first:])  # kept after its trial
    assert alloc.trial is None and alloc.reverts == 0
    assert alloc.moves == [(first, Move("critic", TRAIN, ROLLOUT))]


def test_a_move_measured_slower_is_undone_and_never_tried_again() -> None:
    # the model says the move pays, but training on the rollout worker costs 5 s a step more
    # (it delays the next step's rollout): the trial must catch it
    alloc = ElasticAllocator(UNITS, [TRAIN], [ROLLOUT], AllocatorConfig(trial_steps=2))
    world = World(alloc, extra={ROLLOUT: 5.0})
    moves = world.run(14)
    assert moves[:2] == [Move("critic", TRAIN, ROLLOUT), Move("critic", ROLLOUT, TRAIN)]
    assert alloc.reverts >= 1 and ("critic", ROLLOUT) in alloc.refused
    assert world.placed[-1]["critic"] == TRAIN
    # every later try moved another unit, and each was undone too (all cost 5 s)
    assert all(m.unit != "critic" or m.target == TRAIN for m in moves[2:])
    assert ("critic", ROLLOUT) not in {(m.unit, m.target) for m in moves[2:]}


def test_no_move_below_the_minimum_gain() -> None:
    alloc = ElasticAllocator(UNITS, [TRAIN], [ROLLOUT], AllocatorConfig(min_gain=0.3))
    assert World(alloc).run(8) == []  # the best move cuts 9 s to 7 s: 22% < 30%
    assert all(alloc.worker_of(u, 9) == TRAIN for u in UNITS)


def test_a_units_first_step_on_a_new_worker_is_left_out_of_its_demand() -> None:
    alloc = ElasticAllocator(["a", "b"], ["w0"], ["w1"], AllocatorConfig(warmup_steps=0))
    for k, train_s in enumerate((2.0, 2.0)):
        alloc.worker_of("a", k)
        alloc.observe("w0", "a", train_s, k)
        alloc.observe("w0", "b", 2.0, k)
        move = alloc.end_step(k, 4.0 * (k + 1))
    assert move == Move("a", "w0", "w1")
    assert alloc.worker_of("a", 2) == "w1"
    alloc.observe("w1", "a", 50.0, 2)  # the trainer is built on w1: not its demand
    alloc.observe("w0", "b", 2.0, 2)
    alloc.end_step(2, 10.0)
    assert alloc.demand["a"] == pytest.approx(2.0)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="ema"):
        AllocatorConfig(ema=0)
    with pytest.raises(ValueError, match="min_gain"):
        AllocatorConfig(min_gain=1.0)
    with pytest.raises(ValueError, match="trial_steps"):
        AllocatorConfig(trial_steps=0)
