"""The Joint Orchestrator's compiler: MEG × steps × micro-batches → one task graph.

Per step k and micro-batch j it submits (DESIGN.md §4):

    generate(node, k, j)   after its parents' generate(·, k, j) and the weights it needs
    score(k, j)            after every generate(·, k, j)
    train(A, k, j)         after score(k, j) and A's previous micro-batch / optimizer step
    step(A, k)             after every train(A, k, ·); publishes A's version for step k+1

The dependencies ARE the pipeline: Dask starts each task the moment its inputs exist. The
mode only changes which edges exist (DESIGN.md §5):

    flex      generate(node of A, k) needs step(A, k-1): zero staleness, per-agent readiness
    sync      generate(·, k) needs step(every agent, k-1), and train(·, k, ·) needs every
              score(k, ·): the stage-synchronous barrier, the baseline
    async(η)  generate(node of A, k) needs step(A, k-1-η): rows may be η versions old; the
              loss corrects them with importance ratios from the stored behaviour logprobs

A bounded window of steps is in flight; placement is explicit (the balancer picks the rollout
worker of each generate task, each agent trains on its own sticky training worker).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engines.rollout.balancer import Balancer, HierarchicalBalancer, NoBalancing
from flows.cluster import Workers
from flows.executors import Executor
from meg import expand_episode, topological_order
from tasks.context import RunContext
from tasks.rollout import Episode, episode_id
from tasks.worker import splits_of
from workloads.datasets import batch_for_step


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


def rollout_hosts(workers: Workers, n_agents: int) -> list[str]:
    """Balancer host ids: enough model instances on the rollout workers for every agent."""
    per = math.ceil(n_agents / len(workers.rollout))
    return [f"{w}#{i}" for i in range(per) for w in workers.rollout]


def host_worker(host: str) -> str:
    return host.rsplit("#", 1)[0]


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
        self.agents = [a for a in spec.agents if any(n.agent == a for n in spec.nodes.values())]
        self.base_versions = base_versions
        self.train_worker = {
            a: workers.train[i % len(workers.train)] for i, a in enumerate(self.agents)
        }
        hosts = rollout_hosts(workers, len(self.agents))
        self.balancer: Balancer = (HierarchicalBalancer if cfg.balance else NoBalancing)(
            self.agents, hosts
        )
        self.on_event = on_event or (lambda kind, ref: None)
        self.samples_per_episode = {n: len(s) for n, s in expand_episode(spec).samples.items()}
        self.gen: dict[tuple[str, int, int], Any] = {}
        self.score: dict[tuple[int, int], Any] = {}
        self.train: dict[tuple[str, int, int], Any] = {}
        self.step: dict[tuple[str, int], Any] = {}
        self._pending: list[tuple[str, Any, str | None, int]] = []  # kind, handle, host, est
        self._gens_left: dict[int, int] = {}
        self.results: list[Any] = []
        self._rr = 0

    # ---- phases -------------------------------------------------------------------------
    def episodes(self, k: int) -> list[tuple[Episode, ...]]:
        """Step k's episodes, split into contiguous micro-batches (whole episodes each)."""
        items = batch_for_step(splits_of(self.ctx), k, self.cfg.episodes_per_step, self.ctx.seed)
        eps = [(episode_id(k, i), t) for i, t in enumerate(items)]
        m = self.cfg.micro_batches
        bounds = [round(i * len(eps) / m) for i in range(m + 1)]
        return [tuple(eps[bounds[j] : bounds[j + 1]]) for j in range(m)]

    def submit_rollout(self, k: int) -> None:
        """generate(node, k, j) for every node and micro-batch, then score(k, j)."""
        spec = self.ctx.spec
        for j, eps in enumerate(self.episodes(k)):
            for node in self.order:
                agent = spec.nodes[node].agent
                weights, barrier = self._weights_dep(agent, k)
                est = len(eps) * self.samples_per_episode[node] * spec.node_max_tokens(node)
                host = self.balancer.place(agent, est)
                parents = tuple(self.gen[(p, k, j)] for p in spec.nodes[node].inputs)
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
                        after=parents + barrier,
                    ),
                    self.workers.pin(host_worker(host)),
                    host,
                    est,
                )
            self._gens_left[k] = self._gens_left.get(k, 0) + len(self.order)
            rollers = self.workers.rollout
            self._rr += 1
            self.score[(k, j)] = self._submit(
                "score",
                dict(
                    ctx=self.ctx,
                    step=k,
                    mb=j,
                    episodes=eps,
                    after=tuple(self.gen[(n, k, j)] for n in self.order),
                ),
                self.workers.pin(rollers[self._rr % len(rollers)]),
            )

    def submit_training(self, k: int) -> None:
        """train(A, k, j) per micro-batch, then one optimizer step per agent."""
        m = self.cfg.micro_batches
        for agent in self.agents:
            chain = self.step.get((agent, k - 1))
            worker = self.train_worker[agent]
            for j in range(m):
                scores = (
                    [self.score[(k, jj)] for jj in range(m)]
                    if self.ctx.mode == "sync"
                    else [self.score[(k, j)]]
                )
                deps = (*scores, chain) if chain is not None else tuple(scores)
                chain = self.train[(agent, k, j)] = self._submit(
                    "train",
                    dict(ctx=self.ctx, agent=agent, step=k, mb=j, after=deps),
                    self.workers.pin(worker),
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
            )

    def _weights_dep(self, agent: str, k: int) -> tuple[Any, tuple[Any, ...]]:
        """(the step whose published version this rollout needs, extra barrier deps)."""
        lag = 1 + (self.ctx.staleness if self.ctx.mode == "async" else 0)
        weights = self.step.get((agent, k - lag))
        barrier: tuple[Any, ...] = ()
        if self.ctx.mode == "sync":
            barrier = tuple(self.step[(a, k - 1)] for a in self.agents if (a, k - 1) in self.step)
        return weights, barrier

    # ---- waiting ------------------------------------------------------------------------
    def _submit(
        self,
        kind: str,
        kwargs: dict[str, Any],
        pin: dict[str, Any],
        host: str | None = None,
        est: int = 0,
    ) -> Any:
        handle = self.ex.submit(kind, kwargs, pin)
        self._pending.append((kind, handle, host, est))
        return handle

    def poll(self) -> int:
        """Collect finished tasks (raising the first failure); returns how many finished."""
        still, finished = [], 0
        for kind, handle, host, est in self._pending:
            if not self.ex.done(handle):
                still.append((kind, handle, host, est))
                continue
            ref = self.ex.result(handle)  # raises the task's error: the run stops, loudly
            finished += 1
            self.results.append(ref)
            if kind == "generate" and host is not None:
                self.balancer.complete(host, est)
                self.balancer.observe(ref.agent, ref.decode_tokens)
                self._gens_left[ref.step] -= 1
                if self._gens_left[ref.step] == 0:
                    self.balancer.end_step()
            self.on_event(kind, ref)
        self._pending = still
        return finished

    def wait(self, predicate: Callable[[], bool], interval: float = 0.05) -> None:
        while True:
            self.poll()
            if predicate():
                return
            time.sleep(interval)

    def wait_window(self, k: int) -> None:
        """Block until at most `window` steps are in flight before step k is submitted."""
        old = k - self.cfg.window
        handles = [self.step[(a, old)] for a in self.agents if (a, old) in self.step]
        self.wait(lambda: all(self.ex.done(h) for h in handles))

    def handles_of(self, k: int) -> list[Any]:
        """Every submitted handle of step k (generate, score, train, optimizer step)."""
        return [
            *(h for (_, kk, _), h in self.gen.items() if kk == k),
            *(h for (kk, _), h in self.score.items() if kk == k),
            *(h for (_, kk, _), h in self.train.items() if kk == k),
            *(h for (_, kk), h in self.step.items() if kk == k),
        ]

    def finish(self) -> list[Any]:
        self.wait(lambda: not self._pending)
        return self.results
