"""The real pipeline through the simulator: the structure of its modes, and a step time
computed by hand (simulated seconds only, never the wall clock)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from bench.sim.lengths import Quantiles
from bench.sim.replay import Arm, Layout, SimRun, simulate
from bench.sim.validate import one_each, per_agent
from meg import MEGSpec, build_spec, validate


@dataclass(frozen=True, slots=True)
class Equal:
    """Costs: every task of a kind takes the same time, wherever it runs."""

    g: float = 1.0
    s: float = 0.5
    t: float = 2.0
    p: float = 0.25
    dispatch_s: float = 0.0
    cores: int | None = None
    accelerators: bool = False

    def generate(self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int) -> float:
        return self.g

    def generate_active(
        self, model: str, prompts: np.ndarray, lengths: np.ndarray, accel: int
    ) -> float:
        return 1.0

    def score(self, rows: int) -> float:
        return self.s

    def train(self, model: str, tokens: int, accel: int) -> float:
        return self.t

    def step(self, model: str, accel: int) -> float:
        return self.p

    def swap(self, model: str, accel: int) -> float:
        return 0.0

    load = switch = swap


def spec_of(nodes: dict[str, dict[str, object]]) -> MEGSpec:
    agents = {n["agent"]: {"model": "hf://sim/tiny"} for n in nodes.values()}
    data = {
        "name": "t",
        "agents": agents,
        "nodes": nodes,
        "rewards": {n: {"fn": "exact_answer"} for n in nodes},
        "dataset": {"generator": "arithmetic", "train_size": 64, "eval_size": 8},
    }
    from engines.training.catalog import loss_names
    from workloads.rewards import known_rewards

    return validate(build_spec(data), known_rewards=known_rewards(), known_losses=loss_names())


ONE = spec_of({"solve": {"agent": "solver", "template": "{question}", "n": 2}})
CHAIN = spec_of(
    {
        "solve": {"agent": "solver", "template": "{question}", "n": 2},
        "verify": {"agent": "verifier", "template": "{solve}", "n": 2, "inputs": {"solve": "best"}},
    }
)


def run(spec: MEGSpec, arm: Arm, mbs: int, layout: Layout | None = None, steps: int = 4) -> SimRun:
    lengths = {n: Quantiles((2.0, 2.0)) for n in spec.nodes}
    agents = len({n.agent for n in spec.nodes.values()})
    return simulate(
        spec,
        arm,
        layout or one_each(agents),
        Equal(),
        lengths,
        dict.fromkeys(spec.nodes, 4.0),
        steps,
        4,
        mbs,
    )


def test_one_micro_batch_runs_its_four_tasks_back_to_back() -> None:
    r = run(ONE, Arm("flex"), 1)
    assert r.step_s == pytest.approx(1.0 + 0.5 + 2.0 + 0.25)


def test_two_micro_batches_overlap_training_with_rollout_by_hand() -> None:
    """rollout worker: gen0 [0,1], score0 [1,1.5] (it outranks gen1), gen1 [1.5,2.5], score1
    [2.5,3]; training worker: train0 [1.5,3.5], train1 [3.5,5.5], step [5.5,5.75]. The next
    step's gen0 needs that step: one step every 5.75 s (7.25 without the overlap)."""
    r = run(ONE, Arm("flex"), 2)
    assert r.step_s == pytest.approx(5.75)
    step0 = [t for t in r.timings if t.step == 0]
    assert [(t.phase, t.start) for t in step0 if t.worker == "rollout-0"] == [
        ("generate", 0.0),
        ("score", 1.0),
        ("generate", 1.5),
        ("score", 2.5),
    ]


def test_sync_barrier_no_rollout_of_a_step_before_every_agent_stepped() -> None:
    r = run(CHAIN, Arm("sync"), 2, steps=3)
    for k in (1, 2):
        last_step = max(t.end for t in r.timings if t.phase == "optimizer_step" and t.step == k - 1)
        first_gen = min(t.start for t in r.timings if t.phase == "generate" and t.step == k)
        assert first_gen >= last_step


def test_flex_starts_an_agents_next_step_before_the_others_finish() -> None:
    r = run(CHAIN, Arm("flex"), 2, steps=3)
    solver_next = min(
        t.start for t in r.timings if t.phase == "generate" and t.agent == "solver" and t.step == 1
    )
    verifier_done = max(
        t.end
        for t in r.timings
        if t.phase == "optimizer_step" and t.agent == "verifier" and t.step == 0
    )
    assert solver_next < verifier_done
    assert r.step_s < run(CHAIN, Arm("sync"), 2, steps=3).step_s


def test_async_rolls_out_ahead_of_the_weights() -> None:
    r = run(CHAIN, Arm("async", 1), 2, steps=4)
    gen1 = min(t.start for t in r.timings if t.phase == "generate" and t.step == 1)
    step0 = min(t.end for t in r.timings if t.phase == "optimizer_step" and t.step == 0)
    assert gen1 < step0  # step 1 samples with version 0: η = 1


def test_colocated_workers_run_both_roles_one_task_at_a_time() -> None:
    r = run(CHAIN, Arm("sync", balance=False), 2, per_agent(2), steps=3)
    for w in ("worker-0", "worker-1"):
        mine = sorted((t for t in r.timings if t.worker == w), key=lambda t: t.start)
        assert {t.phase for t in mine} >= {"generate", "train_micro_batch", "optimizer_step"}
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(mine))
    agent_of = {t.worker: t.agent for t in r.timings if t.phase == "train_micro_batch"}
    assert agent_of == {"worker-0": "solver", "worker-1": "verifier"}  # each its own worker


@dataclass(frozen=True, slots=True)
class HeavyTraining(Equal):
    """Training of the `big` model costs 6× the rest (bench/elastic.py's skew)."""

    def train(self, model: str, tokens: int, accel: int) -> float:
        return 6.0 * self.t if model.endswith("big") else self.t

    def swap(self, model: str, accel: int) -> float:
        return 0.1


def test_elastic_allocation_moves_heavy_training_to_the_idle_rollout_worker() -> None:
    """The simulator replays elastic allocation too: the real allocator decides from the
    simulated timings, a `hand_over` task moves the state (two swaps over the link), and the
    step gets shorter than on the fixed placement (bench/elastic.py measured 1.23× for real)."""
    spec = spec_of(
        {
            "solve": {"agent": "solver", "template": "{question}", "n": 2},
            "critic": {
                "agent": "critic",
                "template": "{solve}",
                "n": 1,
                "inputs": {"solve": "all"},
            },
            "check": {
                "agent": "checker",
                "template": "{critic}",
                "n": 1,
                "inputs": {"critic": "all"},
            },
        }
    )
    models = {"solver": "hf://sim/big", "critic": "hf://sim/big", "checker": "hf://sim/tiny"}
    spec = spec.model_copy(
        update={
            "agents": {a: s.model_copy(update={"model": models[a]}) for a, s in spec.agents.items()}
        }
    )
    lengths = {n: Quantiles((2.0, 2.0)) for n in spec.nodes}

    def sim(elastic: bool) -> SimRun:
        return simulate(
            spec, Arm("flex", elastic=elastic), one_each(3), HeavyTraining(), lengths,
            dict.fromkeys(spec.nodes, 4.0), 14, 4, 2,
        )  # fmt: skip

    fixed, elastic = sim(False), sim(True)
    assert fixed.counts["handovers"] == 0 and elastic.counts["handovers"] >= 1
    moved = [t for t in elastic.timings if t.phase == "hand_over"]
    assert moved and all(t.agent in ("solver", "critic") for t in moved)
    (rollout,) = one_each(3).rollout
    assert any(t.worker == rollout for t in elastic.timings if t.phase == "train_micro_batch")
    assert elastic.mean_step_s < fixed.mean_step_s
    assert len(elastic.per_step) == len(fixed.per_step) == 14  # every step completes
