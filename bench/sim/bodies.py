"""Simulated task bodies: what each task of the pipeline costs, and the reference it returns.

`SimBodies.start` is called by the executor when a task starts on a worker, in simulated
time order, so it can keep what the real workers keep: which agent each rollout host served
last (a host that changes agent loads the other weights), which role a colocated worker
played last (a role change swaps the engine and the trainer), and the training slots of
each training worker — the project's own `SlotManager`, driven with stand-in trainers, so
LRU eviction is the real policy's and only the swap's duration is modelled.

Results are the real reference types (`GenRef`, `ScoreRef`, `TrainRef`, `StepRef`) with
simulated timings, so the pipeline's bookkeeping (balancer, failure budget, windows) runs
unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch

from bench.sim.costs import Costs
from bench.sim.executor import SimTask, Work
from bench.sim.lengths import Lengths, draw
from engines.training.slots import SlotManager
from meg import MEGSpec, expand_episode
from storage.state import StateStore
from storage.table import SegmentRef
from tasks.context import Timing
from tasks.refs import GenRef, HandOverRef, RewardSum, ScoreRef, StepRef, TrainRef

ROLE = {
    "generate": "rollout",
    "score": "rollout",
    "train_micro_batch": "train",
    "optimizer_step": "train",
    "hand_over": "train",
}


class StandInTrainer:
    """What `SlotManager` needs of a trainer, holding no tensors."""

    def __init__(self, agent: str) -> None:
        self.agent, self.released, self.device = agent, False, torch.device("cpu")

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def meta(self) -> dict[str, Any]:
        return {}

    def release(self) -> None:
        self.released = True

    def load_state(self, tensors: Any, meta: Any, device: str = "cpu") -> None:
        self.released = False

    def close(self) -> None:
        self.released = True


@dataclass(frozen=True, slots=True)
class Drawn:
    """What one generate task produced (the store's role: later tasks read it)."""

    rows: int
    response_tokens: int
    mean_response: float
    sequences: np.ndarray  # prompt + response tokens of each row (what training reads)


@dataclass(slots=True)
class SimBodies:
    spec: MEGSpec
    costs: Costs
    lengths: Mapping[str, Lengths]  # node → response-length distribution
    prompt_tokens: Mapping[str, float]  # node → prompt tokens before its parents' answers
    accel: Mapping[str, int]  # worker → accelerators
    train_slots: int
    seed: int = 0
    run_id: str = "sim"
    drawn: dict[tuple[str, int, int], Drawn] = field(default_factory=dict)
    slots: dict[str, SlotManager] = field(default_factory=dict)
    last_agent: dict[str, str] = field(default_factory=dict)  # rollout worker → agent served last
    last_role: dict[str, str] = field(default_factory=dict)  # worker → rollout | train
    swaps: int = 0
    loads: int = 0
    switches: int = 0
    handovers: int = 0
    per_episode: dict[str, int] = field(default_factory=dict)  # node → samples per episode

    def __post_init__(self) -> None:
        self.per_episode = {n: len(s) for n, s in expand_episode(self.spec).samples.items()}

    # ---- dispatch by kind ---------------------------------------------------------------
    def start(self, kind: str, kwargs: dict[str, Any], worker: str, now: float) -> Work:
        extra = self._role_change(kind, kwargs, worker)
        work = BODIES[kind](self, kwargs, worker)
        total = work.seconds + extra  # a role switch moves data: the accelerators wait
        active = self._share(work.active * work.seconds, total)
        return Work(total, work.make, work.phase, work.agent, work.step, work.micro_batch, active)

    def _share(self, busy_s: float, seconds: float) -> float:
        """The share of a task's accelerator time that computes (1 on a CPU profile)."""
        if not self.costs.accelerators or seconds <= 0:
            return 1.0
        return min(1.0, busy_s / seconds)

    def _model(self, agent: str) -> str:
        return self.spec.agents[agent].model

    def _role_change(self, kind: str, kwargs: dict[str, Any], worker: str) -> float:
        if kind == "score":  # needs neither the engine nor the trainer
            return 0.0
        role, before = ROLE[kind], self.last_role.get(worker)
        self.last_role[worker] = role
        if before is None or before == role:
            return 0.0
        agent = kwargs.get("agent") or self.spec.nodes[kwargs["node"]].agent
        self.switches += 1
        return self.costs.switch(self._model(agent), self.accel[worker])

    # ---- the four bodies ----------------------------------------------------------------
    def generate(self, kw: dict[str, Any], worker: str) -> Work:
        node, k, j = kw["node"], kw["step"], kw["mb"]
        nspec = self.spec.nodes[node]
        agent = nspec.agent
        n = len(kw["episodes"]) * self.per_episode[node]
        lengths = draw(
            self.lengths[node], self.spec.node_max_tokens(node), n, self.seed, k, j, node
        )
        prompt = self.prompt_tokens[node] + sum(
            self.drawn[(p, k, j)].mean_response * (self.spec.nodes[p].n if rule == "all" else 1)
            for p, rule in nspec.inputs.items()
        )
        prompts = np.full(n, prompt)
        model, accel = self._model(agent), self.accel[worker]
        seconds = self.costs.generate(model, prompts, lengths, accel)
        busy = self.costs.generate_active(model, prompts, lengths, accel) * seconds
        if self.last_agent.get(worker, agent) != agent and (load := self.costs.load(model, accel)):
            seconds += load  # the instance takes this agent's weights (after a rebalance)
            self.loads += 1
        self.last_agent[worker] = agent
        d = Drawn(
            n,
            int(lengths.sum()),
            float(lengths.mean()) if n else 0.0,
            prompts + lengths,
        )
        self.drawn[(node, k, j)] = d
        weights = kw["weights"].result if isinstance(kw["weights"], SimTask) else kw["weights"]
        version = (weights.version if weights is not None else kw["base_version"],)

        fused = kw.get("score")  # a score group scored inside this task (one-node MEGs)
        scoring = self.costs.score(n) if fused is not None else 0.0

        def make(t: Timing) -> GenRef:
            seg = SegmentRef(
                "sim://", self.run_id, agent, f"{node}-k{k}-mb{j}", "rows", n, version, 0
            )
            tokens = d.response_tokens
            gen_t = replace(t, end=t.end - scoring)
            score = None
            if fused is not None:
                score_t = Timing("score", "-", k, j, t.worker, gen_t.end, t.end)
                score = ScoreRef(k, j, fused.nodes, n, {}, RewardSum(), score_t)
            return GenRef(
                node, agent, k, j, seg, n, tokens, version, False, gen_t,
                segment_tokens=tokens, score=score,
            )  # fmt: skip

        total = seconds + scoring
        return Work(total, make, "generate", agent, k, j, self._share(busy, total))

    def score(self, kw: dict[str, Any], worker: str) -> Work:
        k, j, group = kw["step"], kw["mb"], kw["group"]
        rows = sum(self.drawn[(n, k, j)].rows for n in group.nodes)

        def make(t: Timing) -> ScoreRef:
            return ScoreRef(k, j, group.nodes, rows, {}, RewardSum(), t)

        return Work(self.costs.score(rows), make, "score", "-", k, j, self._share(0, 1))

    def train(self, kw: dict[str, Any], worker: str) -> Work:
        agent, k, j = kw["agent"], kw["step"], kw["mb"]
        mine = [self.drawn[(n, k, j)] for n, s in self.spec.nodes.items() if s.agent == agent]
        rows = sum(d.rows for d in mine)
        seqs = np.concatenate([d.sequences for d in mine]) if mine else np.zeros(0)
        model, accel = self._model(agent), self.accel[worker]
        compute = self.costs.train(model, seqs, accel)
        seconds = compute + self._acquire(agent, worker)
        segs = tuple(f"{n}-k{k}-mb{j}" for n, s in self.spec.nodes.items() if s.agent == agent)

        def make(t: Timing) -> TrainRef:
            return TrainRef(
                agent, k, j, segs, (k,), rows, sum(d.response_tokens for d in mine), 0.0, t
            )

        mb = -1 if j is None else j
        return Work(seconds, make, "train_micro_batch", agent, k, mb, self._share(compute, seconds))

    def step(self, kw: dict[str, Any], worker: str) -> Work:
        agent, k = kw["agent"], kw["step"]
        model, accel = self._model(agent), self.accel[worker]
        compute = self.costs.step(model, accel)
        seconds = compute + self._acquire(agent, worker)

        def make(t: Timing) -> StepRef:
            return StepRef(agent, k, k + 1, False, 0.0, 0.0, False, t)

        return Work(seconds, make, "optimizer_step", agent, k, -1, self._share(compute, seconds))

    def hand_over(self, kw: dict[str, Any], worker: str) -> Work:
        """Elastic allocation moved the agent's training: its state leaves this worker's
        slots and crosses the host links twice (out to the StateStore, in on the target),
        each way a slot swap's time; the target's first `_acquire` then builds it fresh."""
        agent, k, target = kw["agent"], kw["step"], kw["target"]
        if worker in self.slots:
            self.slots[worker].forget(agent)
        model = self._model(agent)
        seconds = self.costs.swap(model, self.accel[worker]) + self.costs.swap(
            model, self.accel[target]
        )
        self.handovers += 1

        def make(t: Timing) -> HandOverRef:
            return HandOverRef(agent, k, kw["source"], target, 1, t)

        return Work(seconds, make, "hand_over", agent, k, -1, self._share(0, 1))

    # ---- training slots -----------------------------------------------------------------
    def _acquire(self, agent: str, worker: str) -> float:
        """Bind `agent` on the worker's slots (the real LRU policy); seconds of the swaps it
        took. The slot is released at once: a worker runs one task at a time, so the agent
        is never evicted while its task runs, as in the real task."""
        if worker not in self.slots:
            self.slots[worker] = SlotManager(self.train_slots, StateStore(f"memory://sim/{worker}"))
        sm = self.slots[worker]
        before = sm.stats.swaps_out + sm.stats.swaps_in
        sm.acquire(agent, lambda device: cast(Any, StandInTrainer(agent)))
        sm.release(agent)
        moved = sm.stats.swaps_out + sm.stats.swaps_in - before
        self.swaps += moved
        return moved * self.costs.swap(self._model(agent), self.accel[worker])


BODIES = {
    "generate": SimBodies.generate,
    "score": SimBodies.score,
    "train_micro_batch": SimBodies.train,
    "optimizer_step": SimBodies.step,
    "hand_over": SimBodies.hand_over,
}
