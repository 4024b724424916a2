"""The Joint Orchestrator's compiler: MEG × steps × micro-batches → one task graph.

Per step k and micro-batch j it submits:

    generate(node, k, j)   after its parents' generate(·, k, j) and the weights it needs
    score(k, j, g)         after generate(·, k, j) of the nodes score group g waits for
    train(A, k, j)         after the score(k, j, ·) of A's nodes and A's previous micro-batch
                           or optimizer step
    step(A, k)             after every train(A, k, ·); publishes A's version for step k+1

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

A bounded window of steps is in flight; placement is explicit (the balancer picks the rollout
worker of each generate task, each agent trains on its own sticky training worker). Both
place *weight units* (`meg.sharing`), not agents: LoRA agents that share a base are one unit,
so they are always served by the same rollout engines and trained on the same training
worker, where one resident base holds all their adapters.

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

The same race lets a training worker run one other ready micro-batch between an agent's last
micro-batch and its optimizer step. Chaining the optimizer steps in need order would close it
but makes agents whose data is ready wait behind one whose data is not (a team reward is
scored last); measured on fanout (bench/e2e.py), the chain cost more than the race.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engines.rollout.balancer import Balancer, HierarchicalBalancer, NoBalancing
from flows.cluster import Workers
from flows.executors import Executor
from flows.planning import EpisodePlanner, scoring_plan
from meg import ScoreGroup, expand_episode, score_groups, topological_order
from meg.sharing import unit_of
from tasks.context import RunContext
from tasks.failures import FailureBudget
from tasks.refs import ScoreRef


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    steps: int
    episodes_per_step: int
    micro_batches: int
    window: int = 2
    start_step: int = 0
    balance: bool = True

    def __post_init__(self) -> None:
        if self.episodes_per_step < self.micro_batches:
            raise ValueError(
                f"episodes_per_step ({self.episodes_per_step}) must be at least micro_batches "
                f"({self.micro_batches}): every micro-batch needs one whole episode"
            )


Event = Callable[[str, Any], None]

PRIORITY_STRIDE = 1_000_000  # ranks within one step stay below this
LINEAGE_CUT_EVERY = 20  # steps between lineage cuts (Pipeline.wait_window)


def task_priority(step: int, rank: int) -> int:
    """Dask priority (higher runs first): every task of step k before any of step k+1, and
    lower `rank` first within a step."""
    return -(step * PRIORITY_STRIDE + rank)


def need_order(order: list[str], node_agent: dict[str, str]) -> list[str]:
    """Agents by the topological position of their first node: the order in which the next
    step's rollout needs their new weights."""
    first: dict[str, int] = {}
    for i, n in enumerate(order):
        first.setdefault(node_agent[n], i)
    return sorted(first, key=first.__getitem__)


class StepLog:
    """The results of one step's tasks, as the pipeline collects them.

    The per-step Prefect task (`flows.watch`) waits on this instead of fetching the step's
    results a second time: every result crosses the network once, into the driver."""

    def __init__(self, step: int, expected: int) -> None:
        self.step, self.expected = step, expected
        self.refs: list[Any] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def add(self, ref: Any) -> None:
        self.refs.append(ref)
        if len(self.refs) >= self.expected:
            self._done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.set()

    def wait(self) -> list[Any]:
        self._done.wait()
        if self.error is not None:
            raise RuntimeError(f"step {self.step} failed: {self.error}") from self.error
        return list(self.refs)


def rollout_hosts(workers: Workers, n_units: int) -> list[str]:
    """Balancer host ids: enough model instances on the rollout workers for every weight
    unit (an agent with its own weights, or a base shared by LoRA agents)."""
    per = math.ceil(n_units / len(workers.rollout))
    return [f"{w}#{i}" for i in range(per) for w in workers.rollout]


def host_worker(host: str) -> str:
    return host.rsplit("#", 1)[0]


def _drop_before(table: dict[Any, Any], at: int, k: int) -> list[Any]:
    """Remove the entries whose step (`key[at]`) is < k; return their values."""
    return [table.pop(key) for key in [key for key in table if key[at] < k]]


class Pipeline:
    """Holds the futures of the steps in flight; the flow drives it phase by phase."""

    def __init__(
        self,
        ctx: RunContext,
        workers: Workers,
        executor: Executor,
        cfg: PipelineConfig,
        base_versions: dict[str, int],
        on_event: Event | None = None,
    ) -> None:
        self.ctx, self.workers, self.ex, self.cfg = ctx, workers, executor, cfg
        spec = ctx.spec
        self.order = topological_order(spec)
        node_agent = {n: spec.nodes[n].agent for n in self.order}
        self.groups: tuple[ScoreGroup, ...] = (
            score_groups(spec, dict.fromkeys(spec.nodes))  # None: reads all → one group
            if ctx.mode == "sync"
            else scoring_plan(spec)
        )
        self.agents = need_order(self.order, node_agent)
        self.base_versions = base_versions
        self.unit = unit_of(spec, self.agents)  # agent → its weight unit (shared base or own)
        units = list(dict.fromkeys(self.unit[a] for a in self.agents))  # in need order
        train_of = {u: workers.train[i % len(workers.train)] for i, u in enumerate(units)}
        self.train_worker = {a: train_of[self.unit[a]] for a in self.agents}
        self.balancer: Balancer = (HierarchicalBalancer if cfg.balance else NoBalancing)(
            units, rollout_hosts(workers, len(units))
        )
        self.on_event = on_event or (lambda kind, ref: None)
        scoring = spec.run.scoring
        self.failures = FailureBudget(scoring.max_failed_fraction, scoring.min_samples)
        self.samples_per_episode = {n: len(s) for n, s in expand_episode(spec).samples.items()}
        self.gen: dict[tuple[str, int, int], Any] = {}
        self.gen_worker: dict[tuple[str, int, int], str] = {}  # where each generate runs
        self.score: dict[tuple[int, int, int], Any] = {}
        self.train: dict[tuple[str, int, int], Any] = {}
        self.step: dict[tuple[str, int], Any] = {}
        self._pending: list[tuple[str, Any, str | None, int]] = []  # kind, handle, host, est
        self._gens_left: dict[int, int] = {}
        self._refs: dict[int, tuple[Any, Any]] = {}  # id(handle) -> (handle, its result)
        self._forgotten = 0  # steps below this one have no handles any more
        self.results: list[Any] = []
        self.logs: dict[int, StepLog] = {}
        self._rr = 0
        self.carries = spec.run.rollout.carries
        self.root = next((n for n in self.order if not spec.nodes[n].inputs), self.order[0])
        self.plan = EpisodePlanner(
            ctx,
            cfg.episodes_per_step,
            cfg.micro_batches,
            cfg.window,
            cfg.start_step,
            self.results.append,
        )

    # ---- phases -------------------------------------------------------------------------
    def submit_rollout(self, k: int) -> None:
        """generate(node, k, j) for every node and micro-batch, each score group after the
        nodes it waits for."""
        spec = self.ctx.spec
        pos = {n: i for i, n in enumerate(self.order)}
        stride = 2 * len(self.order)  # rank 2i: generate node i; 2i+1: scores waiting on it
        launched = self.plan.planned(k)
        for j, eps in enumerate(self.plan.episodes(k)):
            for i, node in enumerate(self.order):
                agent = spec.nodes[node].agent
                weights, barrier = self._weights_dep(agent, k)
                est = len(launched[j]) * self.samples_per_episode[node] * spec.node_max_tokens(node)
                host = self.balancer.place(self.unit[agent], est)
                parents = tuple(self.gen[(p, k, j)] for p in spec.nodes[node].inputs)
                self.gen_worker[(node, k, j)] = worker = host_worker(host)
                previous_mb = (
                    (self.gen[(node, k, j - 1)],)
                    if j and self.gen_worker[(node, k, j - 1)] == worker
                    else ()
                )
                if self.carries and node == self.root and (node, k - 1, j) in self.gen:
                    previous_mb += (self._resolved(self.gen[(node, k - 1, j)]),)  # resumes it
                self.gen[(node, k, j)] = self._submit(
                    "generate",
                    dict(
                        ctx=self.ctx,
                        node=node,
                        step=k,
                        mb=j,
                        episodes=eps,
                        weights=weights,
                        base_version=self.base_versions.get(agent, 0),
                        after=parents + previous_mb + barrier,
                    ),
                    self.workers.pin(worker),
                    task_priority(k, j * stride + 2 * i),
                    host,
                    est,
                )
            self._gens_left[k] = self._gens_left.get(k, 0) + len(self.order)
            rollers = self.workers.rollout
            for g, group in enumerate(self.groups):
                self._rr += 1
                self.score[(k, j, g)] = self._submit(
                    "score",
                    dict(
                        ctx=self.ctx,
                        step=k,
                        mb=j,
                        episodes=eps,
                        group=group,
                        after=tuple(self.gen[(n, k, j)] for n in group.waits),
                    ),
                    self.workers.pin(rollers[self._rr % len(rollers)]),
                    task_priority(k, j * stride + 2 * pos[group.waits[-1]] + 1),
                )

    def scores_for(self, agent: str, k: int, j: int) -> list[Any]:
        """The score tasks train(agent, k, j) waits for: those of A's nodes in micro-batch j,
        or in sync mode every score of step k (the barrier)."""
        groups = range(len(self.groups))
        if self.ctx.mode == "sync":
            return [self.score[(k, jj, g)] for jj in range(self.cfg.micro_batches) for g in groups]
        nodes = {n for n, spec in self.ctx.spec.nodes.items() if spec.agent == agent}
        return [self.score[(k, j, g)] for g in groups if nodes & set(self.groups[g].nodes)]

    def submit_training(self, k: int) -> None:
        """train(A, k, j) per micro-batch, then one optimizer step per agent; priorities
        follow the need order."""
        m = self.cfg.micro_batches
        for rank, agent in enumerate(self.agents):
            chain = self._resolved(self.step.get((agent, k - 1)))
            worker = self.train_worker[agent]
            for j in range(m):
                scores = self.scores_for(agent, k, j)
                deps = (*scores,) + ((chain,) if chain is not None else ())
                chain = self.train[(agent, k, j)] = self._submit(
                    "train",
                    dict(ctx=self.ctx, agent=agent, step=k, mb=j, after=deps),
                    self.workers.pin(worker),
                    task_priority(k, rank * (m + 1) + j),
                )
            self.step[(agent, k)] = self._submit(
                "step",
                dict(
                    ctx=self.ctx,
                    agent=agent,
                    step=k,
                    trains=tuple(self.train[(agent, k, j)] for j in range(m)),
                ),
                self.workers.pin(worker),
                task_priority(k, rank * (m + 1) + m),
            )

    def _weights_dep(self, agent: str, k: int) -> tuple[Any, tuple[Any, ...]]:
        """(the step whose published version this rollout needs, extra barrier deps)."""
        lag = 1 + (self.ctx.staleness if self.ctx.mode == "async" else 0)
        weights = self._resolved(self.step.get((agent, k - lag)))
        barrier: tuple[Any, ...] = ()
        if self.ctx.mode == "sync":
            prev = [self.step[(a, k - 1)] for a in self.agents if (a, k - 1) in self.step]
            barrier = tuple(self._resolved(h) for h in prev)
        return weights, barrier

    def _resolved(self, handle: Any) -> Any:
        """A finished task's result, else its handle: a value ends the lineage there."""
        held, ref = self._refs.get(id(handle), (None, None))
        return ref if held is handle and handle is not None else handle

    # ---- waiting ------------------------------------------------------------------------
    def _submit(
        self,
        kind: str,
        kwargs: dict[str, Any],
        pin: dict[str, Any],
        priority: int,
        host: str | None = None,
        est: int = 0,
    ) -> Any:
        handle = self.ex.submit(kind, kwargs, {**pin, "priority": priority})
        self._pending.append((kind, handle, host, est))
        return handle

    def poll(self) -> int:
        """Collect finished tasks (raising the first failure); returns how many finished.

        Results of all finished tasks are fetched in one batch (one request per worker)."""
        done: list[tuple[str, Any, str | None, int]] = []
        still: list[tuple[str, Any, str | None, int]] = []
        for p in self._pending:
            (done if self.ex.done(p[1]) else still).append(p)
        if not done:
            return 0
        refs = self.ex.results([p[1] for p in done])  # raises a task's error: run stops
        self._pending = still
        for (kind, handle, host, est), ref in zip(done, refs, strict=True):
            if ref.step >= self._forgotten:
                self._refs[id(handle)] = (handle, ref)
            self.results.append(ref)
            if ref.step in self.logs:
                self.logs[ref.step].add(ref)
            if kind == "generate" and host is not None:
                self.balancer.complete(host, est)
                self.balancer.observe(self.unit[ref.agent], ref.decode_tokens)
                self._gens_left[ref.step] -= 1
                if self._gens_left[ref.step] == 0:
                    self.balancer.end_step()
            self.on_event(kind, ref)
            if isinstance(ref, ScoreRef):  # past the failure budget: the run stops here
                self.failures.add(ref.step, ref.rows, ref.failed, ref.failure)
        return len(done)

    def wait(self, predicate: Callable[[], bool], interval: float = 0.05) -> None:
        while True:
            self.poll()
            if predicate():
                return
            self.ex.idle(interval)

    def wait_window(self, k: int) -> None:
        """Block until at most `window` steps are in flight before step k is submitted.

        Every LINEAGE_CUT_EVERY steps, until none is: step k then gets its inputs from older
        steps as values (`_resolved`), so no task of step >= k depends on an older task. Dask
        keeps a finished task and its arguments while a task that depends on it exists: with
        no cut, every task of the run stayed on the scheduler, ~25 KB each (bench/soak.py)."""
        old = k - self.cfg.window
        handles = [self.step[(a, old)] for a in self.agents if (a, old) in self.step]
        if k % LINEAGE_CUT_EVERY == 0:
            handles = [h for t in (self.gen, self.score, self.train, self.step) for h in t.values()]
        self.wait(lambda: all(self.ex.done(h) for h in handles))
        self.poll()  # collect what finished after the last poll: `_resolved` needs it
        self.forget_before(k - max(self.cfg.window, 1 + self.ctx.staleness))

    def forget_before(self, k: int) -> None:
        """Drop the handles of steps < k (step k uses steps >= k - max(window, 1 + η); a
        running task stays held by `_pending`). Held, each kept its task's result and
        arguments alive on the scheduler and the workers for the whole run (bench/soak.py)."""
        self._forgotten = max(self._forgotten, k)
        for table, at in ((self.gen, 1), (self.score, 0), (self.train, 1), (self.step, 1)):
            for handle in _drop_before(table, at, k):
                self._refs.pop(id(handle), None)
        _drop_before(self.gen_worker, 1, k)

    def handles_of(self, k: int) -> list[Any]:
        """Every submitted handle of step k (generate, score, train, optimizer step)."""
        return [
            *(h for (_, kk, _), h in self.gen.items() if kk == k),
            *(h for (kk, _, _), h in self.score.items() if kk == k),
            *(h for (_, kk, _), h in self.train.items() if kk == k),
            *(h for (_, kk), h in self.step.items() if kk == k),
        ]

    def abort(self, error: BaseException) -> None:
        """Release everyone waiting on a step log: the run is failing with `error`."""
        for log in self.logs.values():
            log.fail(error)

    def step_log(self, k: int) -> StepLog:
        """A log that fills with step k's results (call after submitting step k)."""
        self.logs[k] = StepLog(k, len(self.handles_of(k)))
        return self.logs[k]

    def finish(self) -> list[Any]:
        self.wait(lambda: not self._pending)
        return self.results
