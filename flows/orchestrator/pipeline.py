"""The Joint Orchestrator's compiler: MEG × steps × micro-batches → one task graph.

Per step k and micro-batch j it submits:

    generate(node, k, j)   after its parents' generate(·, k, j) and the weights it needs
    score(k, j, g)         after generate(·, k, j) of the nodes score group g waits for
                           (a one-node MEG: inside that generate task, `fused_scores`)
    train(A, k, j)         after the score(k, j, ·) of A's nodes and A's previous micro-batch
                           or optimizer step
    step(A, k)             after every train(A, k, ·); publishes A's version for step k+1
                           (an agent that back-propagates on its rollout workers,
                           `run.rollout_gradients`: no train tasks; step(A, k) after its
                           generate(·, k, ·), adding the gradients they computed)
    hand_over(A, k)        (elastic allocation only) when A trains on another worker from
                           step k: after step(A, k-1), on A's old worker; train(A, k, 0)
                           waits for it

(the task kinds `generate`, `score`, `train_micro_batch`, `optimizer_step`, `hand_over`: one
name each in this module, the executors' table, Prefect and `tasks/`).

A score group (`meg.score_groups`) holds the nodes that become scorable together: a node whose
reward reads only its own answer is scored right after it is generated, a team reward waits
for the final node. That is what lets an agent train on a micro-batch before its episodes end.

The dependencies ARE the pipeline: Dask starts each task the moment its inputs exist. The
mode only changes which edges exist:

    flex      generate(node of A, k) needs step(A, k-1): zero staleness, per-agent readiness
    sync      generate(·, k) needs step(every agent, k-1), and train(·, k, ·) needs every
              score(k, ·, ·): the stage-synchronous barrier, the baseline. Its barrier makes
              finer scoring pointless, so sync scores each micro-batch in one task (the
              baseline at its fastest)
    async(η)  generate(node of A, k) needs step(A, k-1-η): rows may be η versions old; the
              loss corrects them with importance ratios from the stored behaviour logprobs

A bounded window of steps is in flight. The parts, one job each: `placement` (which engine
or worker runs a task; the balancer), `futures` (the handles in flight, lineage cuts),
`planning` (which episodes a step rolls out), `tasks.failures.FailureBudget` (when failed
reward calls stop the run); this module wires them into edges and priorities.

Order on a worker matters as much as the edges (each worker runs one task at a time). Dask
starts whichever task is ready when one finishes, before the scheduler has even heard of the
tasks that finish made ready. Left alone, a rollout worker interleaves micro-batches, so no
micro-batch is scored until all are generated and training has nothing to overlap with. So
every task carries a priority (earlier step first; within a step, micro-batch then
topological order for rollout, and for training the *need order*: the agent whose node comes
first in the next step trains first), and one ordering edge closes the race that priorities
cannot:

    generate(node, k, j)   after generate(node, k, j-1)   micro-batches flow through in order
                           (when both run on one worker)

The edge only exists where the race does: when both micro-batches are placed on one worker.
Across workers (several rollout workers per agent) it would only serialize a node's
micro-batches: the cluster simulator (bench/sim) found that it made a step of the paper's
setting wait for 4 long-tail generate times in a row (flex 1.94× slower on a 3-agent chain).

Training has no such edge between an agent's first two micro-batches: whichever is scored
first trains first (their gradients add up to the same bits in either order;
`tasks.order.parts_before`). Chained, a training worker idled while micro-batch 1 was
ready and 0 was still generating on another worker: on the TRL peer job (8×4×32, two rollout
workers) micro-batch 1 came first in about half the steps, and without the edge the step
took 4–7% less (docs/training.md), with the same final weights bit for bit. From the third
on, a micro-batch waits for all before it.

The same race lets a training worker run one other ready micro-batch between an agent's last
micro-batch and its optimizer step. Chaining the optimizer steps in need order would close it
but makes agents whose data is ready wait behind one whose data is not (a team reward is
scored last); measured on fanout (bench/e2e.py), the chain cost more than the race.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flows.cluster.start import Workers
from flows.orchestrator.executors import Executor
from flows.orchestrator.futures import Futures, StepLog
from flows.orchestrator.placement import Placement, engine_slots, host_worker
from flows.orchestrator.planning import EpisodePlanner, scoring_plan
from flows.orchestrator.rollout_grads import gradient_agents
from meg import ScoreGroup, expand_episode, score_groups
from tasks.context import RunContext
from tasks.failures import FailureBudget
from tasks.order import parts_before
from tasks.refs import Episode, ScoreRef

log = logging.getLogger(__name__)
Event = Callable[[str, Any], None]
Pending = tuple[str, Any, str, str | None, int]  # kind, handle, worker, host, est. tokens

PRIORITY_STRIDE = 1_000_000  # ranks within one step stay below this
LINEAGE_CUT_EVERY = 20  # steps between lineage cuts (Pipeline.wait_window)


def task_priority(step: int, rank: int) -> int:
    """Dask priority (higher runs first): every task of step k before any of step k+1, and
    lower `rank` first within a step."""
    return -(step * PRIORITY_STRIDE + rank)


def score_groups_of(ctx: RunContext) -> tuple[ScoreGroup, ...]:
    """The score groups: per reward reads, or one per micro-batch in sync mode (its barrier
    makes finer scoring pointless)."""
    spec = ctx.spec
    if ctx.mode == "sync":
        return score_groups(spec, dict.fromkeys(spec.nodes))  # None: reads all → one group
    return scoring_plan(spec)


def fused_scores(ctx: RunContext, groups: tuple[ScoreGroup, ...]) -> dict[str, int]:
    """Node → the score group its generate task scores itself: in a one-node MEG, the group
    that waits on that node alone.

    Why: a one-node MEG's step is a chain (generate → score → train → step) with nothing to
    overlap the score task with, so its own task costs a hop and a store read on the critical
    path (measured: docs/architecture.md#score-groups). In a larger graph a separate score
    task can run beside the worker's next generate, and the benchmarks and the simulator's
    calibration were measured that way: left as it is."""
    if len(ctx.spec.nodes) != 1:
        return {}
    return {g.waits[0]: i for i, g in enumerate(groups) if len(g.waits) == 1}


class Pipeline:
    """Submits the tasks of each step with their edges and priorities, and collects their
    results; the flow drives it phase by phase (`flows.train.run_pipeline`)."""

    def __init__(
        self,
        ctx: RunContext,
        workers: Workers,
        executor: Executor,
        start_step: int = 0,
        base_versions: dict[str, int] | None = None,
        on_event: Event | None = None,
    ) -> None:
        spec, run = ctx.spec, ctx.run
        self.place = Placement(spec, workers, run.balance, run.elastic)
        slots = engine_slots(workers, len(self.place.units))
        self.ctx, self.workers, self.executor = replace(ctx, engine_slots=slots), workers, executor
        self.trained_on: dict[str, str] = {}  # agent → the worker its state is on
        self.futures = Futures()
        self.groups = score_groups_of(ctx)
        self.fused = fused_scores(ctx, self.groups)
        self.grads = gradient_agents(spec)  # agents back-propagating on rollout workers
        self.failures = FailureBudget(run.scoring.max_failed_fraction, run.scoring.min_samples)
        self.base_versions = base_versions or {}
        self.on_event = on_event or (lambda kind, ref: None)
        self.samples_per_episode = {n: len(s) for n, s in expand_episode(spec).samples.items()}
        self.results: list[Any] = []
        self.logs: dict[int, StepLog] = {}
        self._pending: list[Pending] = []
        self.plan = EpisodePlanner(
            ctx,
            run.episodes_per_step,
            run.micro_batches,
            run.window,
            start_step,
            self.results.append,
        )

    @property
    def order(self) -> list[str]:
        return self.place.order

    @property
    def agents(self) -> list[str]:
        return self.place.agents

    # ---- phases -------------------------------------------------------------------------
    def submit_rollout(self, k: int) -> None:
        """generate(node, k, j) for every node and micro-batch, each score group after the
        nodes it waits for."""
        launched = self.plan.planned(k)
        for j, eps in enumerate(self.plan.episodes(k)):
            for i, node in enumerate(self.order):
                self._submit_generate(node, k, j, eps, len(launched[j]), i)
            self.place.expect_generates(k, len(self.order))
            self._submit_scores(k, j, eps)

    def _rank(self, j: int, i: int) -> int:
        """Rollout ranks within a step: micro-batch first, then 2i for generate of node i and
        2i+1 for the scores that wait on it."""
        return j * 2 * len(self.order) + i

    def _submit_generate(
        self, node: str, k: int, j: int, eps: tuple[Episode, ...], launched: int, i: int
    ) -> None:
        spec, gen, where = self.ctx.spec, self.futures["generate"], self.futures.generate_worker
        agent = spec.nodes[node].agent
        weights, barrier = self._weights_dep(agent, k)
        est = launched * self.samples_per_episode[node] * spec.node_max_tokens(node)
        host = self.place.rollout_host(agent, est)
        where[(node, k, j)] = worker = host_worker(host)
        parents = tuple(gen[(p, k, j)] for p in spec.nodes[node].inputs)
        # micro-batches flow through a worker in order (module docstring)
        previous = (gen[(node, k, j - 1)],) if j and where[(node, k, j - 1)] == worker else ()
        if self.plan.carry_limit and node == self.order[0] and (node, k - 1, j) in gen:
            previous += (self.futures.resolved(gen[(node, k - 1, j)]),)  # resumes it
        kwargs = dict(
            ctx=self.ctx,
            node=node,
            step=k,
            mb=j,
            episodes=eps,
            weights=weights,
            base_version=self.base_versions.get(agent, 0),
            after=parents + previous + barrier,
        )
        if node in self.fused:
            kwargs["score"] = self.groups[self.fused[node]]
            kwargs["grad"] = agent in self.grads
        gen[(node, k, j)] = self._submit(
            "generate", kwargs, worker, k, self._rank(j, 2 * i), host, est
        )

    def _submit_scores(self, k: int, j: int, eps: tuple[Episode, ...]) -> None:
        pos = {n: i for i, n in enumerate(self.order)}
        gen = self.futures["generate"]
        for g, group in enumerate(self.groups):
            if self.fused.get(group.waits[-1]) == g:  # scored inside the generate task
                self.futures["score"][(k, j, g)] = gen[(group.waits[-1], k, j)]
                continue
            after = tuple(gen[(n, k, j)] for n in group.waits)
            kwargs = dict(ctx=self.ctx, step=k, mb=j, episodes=eps, group=group, after=after)
            rank = self._rank(j, 2 * pos[group.waits[-1]] + 1)
            self.futures["score"][(k, j, g)] = self._submit(
                "score", kwargs, self.place.score_worker(), k, rank
            )

    def scores_for(self, agent: str, k: int, j: int) -> list[Any]:
        """The score tasks train_micro_batch(agent, k, j) waits for: those of A's nodes in
        micro-batch j, or in sync mode every score of step k (the barrier)."""
        score, groups = self.futures["score"], range(len(self.groups))
        if self.ctx.mode == "sync":
            return [score[(k, jj, g)] for jj in range(self.ctx.run.micro_batches) for g in groups]
        nodes = set(self.ctx.nodes_of(agent))
        return [score[(k, j, g)] for g in groups if nodes & set(self.groups[g].nodes)]

    def submit_training(self, k: int) -> None:
        """train_micro_batch(A, k, j) per micro-batch, then one optimizer_step per agent;
        priorities follow the need order."""
        m = self.ctx.run.micro_batches
        trains, steps = self.futures["train_micro_batch"], self.futures["optimizer_step"]
        for rank, agent in enumerate(self.agents):
            chain = self.futures.resolved(steps.get((agent, k - 1)))
            worker = self.place.train_worker(agent, k)
            start = self._hand_over(agent, k, worker, chain, rank * (m + 1))
            if agent in self.grads:  # the parts come back-propagated: one task adds and steps
                (node,) = self.ctx.nodes_of(agent)
                parts = tuple(self.futures["generate"][(node, k, j)] for j in range(m))
                kwargs = dict(ctx=self.ctx, agent=agent, step=k, trains=(), parts=parts)
                kwargs["after"] = (start,) if start is not None else ()
                steps[(agent, k)] = self._submit(
                    "optimizer_step", kwargs, worker, k, rank * (m + 1) + m
                )
                continue
            for j in range(m):
                before = [trains[(agent, k, i)] for i in range(parts_before(j))]
                deps = (*self.scores_for(agent, k, j), *before)
                deps += (start,) if start is not None else ()
                kwargs = dict(ctx=self.ctx, agent=agent, step=k, mb=j, after=deps)
                trains[(agent, k, j)] = self._submit(
                    "train_micro_batch", kwargs, worker, k, rank * (m + 1) + j
                )
            mine = tuple(trains[(agent, k, j)] for j in range(m))
            kwargs = dict(ctx=self.ctx, agent=agent, step=k, trains=mine)
            steps[(agent, k)] = self._submit(
                "optimizer_step", kwargs, worker, k, rank * (m + 1) + m
            )

    def _hand_over(self, agent: str, k: int, worker: str, chain: Any, rank: int) -> Any:
        """When A's training moved to `worker` (elastic allocation), hand its state over from
        the old worker after its last step there; the handle A's training then waits for."""
        old = self.trained_on.setdefault(agent, worker)
        if old == worker:
            return chain
        self.trained_on[agent] = worker
        kwargs = dict(
            ctx=self.ctx,
            agent=agent,
            step=k,
            source=old,
            target=worker,
            after=(chain,) if chain is not None else (),
        )
        handle = self._submit("hand_over", kwargs, old, k, rank)
        self.futures["hand_over"][(agent, k)] = handle
        return handle

    def _weights_dep(self, agent: str, k: int) -> tuple[Any, tuple[Any, ...]]:
        """(the step whose published version this rollout needs, extra barrier deps)."""
        steps, resolved = self.futures["optimizer_step"], self.futures.resolved
        weights = resolved(steps.get((agent, k - 1 - self.ctx.staleness)))
        barrier: tuple[Any, ...] = ()
        if self.ctx.mode == "sync":
            barrier = tuple(resolved(steps[(a, k - 1)]) for a in self.agents if (a, k - 1) in steps)
        return weights, barrier

    # ---- waiting ------------------------------------------------------------------------
    def _submit(
        self,
        kind: str,
        kwargs: dict[str, Any],
        worker: str,
        step: int,
        rank: int,
        host: str | None = None,
        est: int = 0,
    ) -> Any:
        pin = {**self.workers.pin(worker), "priority": task_priority(step, rank)}
        handle = self.executor.submit(kind, kwargs, pin)
        self._pending.append((kind, handle, worker, host, est))
        return handle

    def poll(self) -> int:
        """Collect finished tasks (raising the first failure); returns how many finished.

        Results of all finished tasks are fetched in one batch (one request per worker)."""
        done: list[Pending] = []
        still: list[Pending] = []
        for p in self._pending:
            (done if self.executor.done(p[1]) else still).append(p)
        if not done:
            return 0
        refs = self.executor.results([p[1] for p in done])  # raises a task's error: run stops
        self._pending = still
        for (kind, handle, worker, host, est), ref in zip(done, refs, strict=True):
            if getattr(ref, "scored", None) is not None:  # rows for the trainer, not for us
                ref = replace(ref, scored=None, grad=None)
            self.futures.finished(handle, ref)
            self._collect(kind, ref, worker, host, est)
            if kind == "generate" and ref.score is not None:  # fused: as if a score task
                self._collect("score", ref.score, worker, None, 0)
        return len(done)

    def _collect(self, kind: str, ref: Any, worker: str, host: str | None, est: int) -> None:
        """Take in one task's result (the driver's side of every task kind)."""
        self.results.append(ref)
        if ref.step in self.logs:
            self.logs[ref.step].add(ref)
        if kind == "generate" and host is not None:
            tool = self.ctx.spec.nodes[ref.node].is_tool
            self.place.generated(host, est, ref.agent, ref.timing, tool=tool, startup=ref.startup)
        move = self.place.finished(kind, worker, getattr(ref, "agent", None), ref.timing)
        if move is not None:
            log.info(
                "elastic allocation: %s trains on %s (was %s)", move.unit, move.target, move.source
            )
        self.on_event(kind, ref)
        if isinstance(ref, ScoreRef):  # past the failure budget: the run stops here
            self.failures.add(ref.step, ref.rows, ref.failed, ref.failure)

    def wait(self, predicate: Callable[[], bool], interval: float = 0.05) -> None:
        while True:
            self.poll()
            if predicate():
                return
            self.executor.idle(interval)

    def wait_window(self, k: int) -> None:
        """Block until at most `window` steps are in flight before step k is submitted.

        Every LINEAGE_CUT_EVERY steps, until none is: step k then gets its inputs from older
        steps as values (`Futures.resolved`), so no task of step >= k depends on an older
        task. Dask keeps a finished task and its arguments while a task that depends on it
        exists: with no cut, every task of the run stayed on the scheduler, ~25 KB each
        (bench/soak.py)."""
        window, steps = self.ctx.run.window, self.futures["optimizer_step"]
        old = k - window
        handles = [steps[(a, old)] for a in self.agents if (a, old) in steps]
        if k % LINEAGE_CUT_EVERY == 0:
            handles = self.futures.all()
        self.wait(lambda: all(self.executor.done(h) for h in handles))
        self.poll()  # collect what finished after the last poll: `resolved` needs it
        # step k uses steps >= k - max(window, 1 + η)
        self.futures.forget_before(k - max(window, 1 + self.ctx.staleness))

    def abort(self, error: BaseException) -> None:
        """Release everyone waiting on a step log: the run is failing with `error`."""
        for log in self.logs.values():
            log.fail(error)

    def step_log(self, k: int) -> StepLog:
        """A log that fills with step k's results (call after submitting step k)."""
        self.logs[k] = StepLog(k, len(self.futures.handles_of(k)))
        return self.logs[k]

    def finish(self) -> list[Any]:
        self.wait(lambda: not self._pending)
        return self.results
