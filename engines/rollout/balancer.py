"""Hierarchical rollout load balancing as a pure policy object (no Dask, no Prefect).

State in, placement out: the orchestrator and the cluster simulator both drive the same
object with `observe` / `end_step` / `place` / `complete`, and map host ids to whatever
they run on (Dask workers, simulated devices).

Inter-agent level — how many hosts each agent gets. Its signal is each generate task's
*measured seconds* (`observe(agent, seconds, step)`), folded per step into each agent's work
(the sum over its tasks) and its number of tasks, each an exponential moving average
`x ← α·x_step + (1−α)·x` (`Demand`).

Measured seconds, not decode tokens: at scale a generate task is latency-bound — its time is
set by its longest response, which more hosts do not shorten — and a token count then points
hosts at the agent with the most tokens although its time will not fall (the cluster
simulator measured flex 1.0–1.18× *slower* with a token signal than without balancing). A
task's seconds already hold its longest response and its throughput, on the host it really
ran on, and they do not depend on the split (a host serves one agent, a worker runs one task
at a time).

A split is scored by the rollout time of one step it would give (`step_model`): the agents'
tasks replayed on their hosts in whole rounds (4 tasks take 2 rounds on 2 hosts and on 3),
micro-batch i of an agent after micro-batch i of the agents it reads from (`parents`). Not
by the largest per-agent load: in a chain every agent is on the critical path, and the
split that minimized the largest load made a 15-agent chain 5–15% slower in the simulator.
After each step the balancer moves one host at a time, from any agent to any other, while the
modelled step gets shorter, and tries the result only if it is shorter by at least
`min_gain` (hysteresis: a policy that flaps pays a model load per flip), and not within
`cooldown_steps` of the previous change.

A model is a model: it knows nothing of training, of the steps in flight beside the one it
replays, or of a long tail. So a new split is on trial: its measured rollout span (first
generate start to last generate end of a step) over `trial_steps` steps, from the first step
placed on it, must beat the span measured before it, or the balancer goes back to the old
split and never tries that one again. In steady state balancing is therefore never worse
than the split it started from; a trial costs at most `trial_steps` slower steps. Moves are
minimal: an agent that loses hosts gives up the ones with the fewest outstanding tokens;
hosts that stay keep their agent.

A host moved to another agent first starts that agent's engine (seconds on a CPU, tens of
seconds on a GPU), once, inside the first task it runs for it; so do all hosts in a run's
first step. Those seconds (`observe(..., startup=)`) are nobody's demand, and a step that
paid any is *cold*: it sets neither the measured span nor a trial's verdict, because its
span holds a one-off cost that the split does not repeat. Counted, it made a trial of a
better split lose to the old one whenever the start cost more than the split saved over
`trial_steps` steps, and that split was then never tried again.

Intra-agent level — `place(agent, est_tokens)` takes the agent's hosts in turn, unless
another host has more than one task's worth of tokens less outstanding, and books
`est_tokens` on the host; `complete(host, tokens)` releases them. Plain "fewest outstanding
tokens" put a step's equal micro-batches behind one another on one host over differences
smaller than one task, while another host idled (in the simulator, up to 9% of a step).

Hosts are dedicated to one agent at a time (a model is resident), so `hosts >= agents`.
Departure from the paper: the paper rebalances when a measured max/min load ratio passes a
threshold (Δ = 5) and does not specify the demand's unit or hysteresis; we score splits by
the modelled step instead, for the reasons above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from engines.rollout.step_model import Demand, rollout_makespan


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    ema: float = 0.5  # weight of the newest step in the demand estimate
    min_gain: float = 0.1  # try a new split only if it cuts the modelled step by 10%
    cooldown_steps: int = 1  # steps after a change during which the split stays put
    window: int = 2  # steps in flight: those after a change were placed before it
    trial_steps: int = 2  # steps a new split is measured on before it is kept

    def __post_init__(self) -> None:
        if not 0 < self.ema <= 1:
            raise ValueError(f"BalancerConfig.ema must be in (0, 1], got {self.ema}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"BalancerConfig.min_gain must be in [0, 1), got {self.min_gain}")
        if self.cooldown_steps < 0:
            raise ValueError("BalancerConfig.cooldown_steps must be >= 0")
        if self.window < 1 or self.trial_steps < 1:
            raise ValueError("BalancerConfig.window and trial_steps must be >= 1")


class Balancer(Protocol):
    def hosts_of(self, agent: str) -> tuple[str, ...]: ...
    def observe(
        self,
        agent: str,
        start: float,
        end: float,
        step: int = 0,
        *,
        demand: bool = True,
        startup: float = 0.0,
    ) -> None: ...
    def end_step(self, step: int = 0) -> bool: ...
    def place(self, agent: str, est_tokens: int) -> str: ...
    def complete(self, host: str, tokens: int) -> None: ...


def equal_split(agents: Sequence[str], hosts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Host i goes to agent i mod A (so agents listed first get the leftover hosts)."""
    if len(set(agents)) != len(agents) or len(set(hosts)) != len(hosts):
        raise ValueError("agent names and host ids must be unique")
    if not agents:
        raise ValueError("need at least one agent")
    if len(hosts) < len(agents):
        raise ValueError(
            f"{len(hosts)} hosts for {len(agents)} agents: each agent needs its own host "
            "(hosts hold one resident model); add hosts or merge agents"
        )
    return {a: tuple(hosts[i :: len(agents)]) for i, a in enumerate(agents)}


def _blend(now: Demand, old: Demand, a: float) -> Demand:
    """The exponential moving average of two steps' demand."""
    return Demand(a * now.work + (1 - a) * old.work, a * now.tasks + (1 - a) * old.tasks)


def _moved(counts: dict[str, int], donor: str, taker: str) -> dict[str, int]:
    return {**counts, donor: counts[donor] - 1, taker: counts[taker] + 1}


@dataclass(slots=True)
class Trial:
    """A split on probation: the one it replaced, the measured rollout span per step before
    it, and the spans measured since."""

    previous: dict[str, int]
    baseline: float
    first_step: int  # the first step placed on the new split
    spans: list[float]


@dataclass(slots=True)
class _StepTasks:
    seconds: dict[str, list[float]]
    start: float = float("inf")
    end: float = float("-inf")
    cold: bool = False  # a task of the step started an engine


class _HostBook:
    """What every balancer keeps: the agents, their hosts (the equal split to start from),
    the tokens outstanding on each host, and the number of times the split changed."""

    def __init__(self, agents: Sequence[str], hosts: Sequence[str]) -> None:
        self.agents = tuple(agents)
        self.assignment = equal_split(agents, hosts)
        self.outstanding = dict.fromkeys(hosts, 0)
        self.changes = 0

    def hosts_of(self, agent: str) -> tuple[str, ...]:
        if agent not in self.assignment:
            raise KeyError(f"unknown agent {agent!r}; known: {', '.join(self.agents)}")
        return self.assignment[agent]

    def complete(self, host: str, tokens: int) -> None:
        if host not in self.outstanding:
            raise KeyError(f"unknown host {host!r}")
        self.outstanding[host] = max(0, self.outstanding[host] - tokens)


class HierarchicalBalancer(_HostBook):
    """Demand-following host split per agent + turn-taking placement within an agent."""

    def __init__(
        self,
        agents: Sequence[str],
        hosts: Sequence[str],
        config: BalancerConfig | None = None,
        parents: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`agents` in graph order; `parents[a]`: the agents whose output `a` reads (each
        listed before `a`; none: independent agents)."""
        self.config = config or BalancerConfig()
        order = tuple(agents)
        self.parents = {a: tuple((parents or {}).get(a, ())) for a in order}
        for a, ps in self.parents.items():
            if any(order.index(p) >= order.index(a) for p in ps):
                raise ValueError(f"parents of {a!r} must come before it in `agents`: {ps}")
        super().__init__(agents, hosts)
        self.demand: dict[str, Demand] = {}
        self._steps: dict[int, _StepTasks] = {}  # the generate tasks of each step so far
        self.span: float | None = None  # EMA of the measured rollout span of a step
        self.trial: Trial | None = None
        self.rejected: set[tuple[int, ...]] = set()  # splits measured worse than before
        self.reverts = 0
        self._since_change = self.config.cooldown_steps  # first rebalance is allowed
        self._next: dict[str, int] = {}  # where the next tie-break starts, per agent

    def observe(
        self,
        agent: str,
        start: float,
        end: float,
        step: int = 0,
        *,
        demand: bool = True,
        startup: float = 0.0,
    ) -> None:
        """One generate task of `agent` in `step` ran on its host from `start` to `end`
        (steps overlap: a task of step k+1 may finish before the last one of step k).

        `demand=False` (a tool node's task: the environment, run in the reward processes, not
        on the agent's engine) counts toward the step's span but not the agent's demand:
        more engines would not make the tool faster. `startup`: seconds of the task spent
        starting its engine, left out of the demand; they make the step cold."""
        self.hosts_of(agent)
        if end < start:
            raise ValueError(f"a task cannot end ({end}) before it starts ({start})")
        if not 0 <= startup <= end - start:
            raise ValueError(f"startup {startup} s is not within the task's {end - start} s")
        tasks = self._steps.setdefault(step, self._no_tasks())
        if demand:
            tasks.seconds[agent].append(end - start - startup)
        tasks.cold = tasks.cold or startup > 0
        tasks.start, tasks.end = min(tasks.start, start), max(tasks.end, end)

    def counts(self) -> dict[str, int]:
        return {a: len(h) for a, h in self.assignment.items()}

    def _no_tasks(self) -> _StepTasks:
        return _StepTasks({a: [] for a in self.agents})

    def end_step(self, step: int = 0) -> bool:
        """Fold `step`'s tasks into the estimates; judge a split on trial; maybe re-split
        hosts. True if the split changed."""
        tasks = self._steps.pop(step, None) or self._no_tasks()
        self._fold(tasks.seconds)
        warm = tasks.end >= tasks.start and not tasks.cold
        span = tasks.end - tasks.start if warm else None
        if self.trial is not None:
            return self._judge(step, span)
        if span is not None:
            a = self.config.ema
            self.span = span if self.span is None else a * span + (1 - a) * self.span
        self._since_change += 1
        if self._since_change <= self.config.cooldown_steps or self.span is None:
            return False
        cur = self.counts()
        new = self._search(cur)
        if new is None:
            return False
        # steps already submitted were placed on the old split: judge from the one after
        self.trial = Trial(cur, self.span, step + 1 + self.config.window, [])
        self._change(new)
        return True

    def _judge(self, step: int, span: float | None) -> bool:
        """Keep the split on trial if its measured spans beat the old ones, else go back."""
        trial = self.trial
        assert trial is not None
        if step < trial.first_step or span is None:
            return False
        trial.spans.append(span)
        if len(trial.spans) < self.config.trial_steps:
            return False
        self.trial = None
        self._since_change = 0
        measured = sum(trial.spans) / len(trial.spans)
        self.span = measured
        if measured < trial.baseline:
            return False
        self.rejected.add(self._key(self.counts()))
        self.reverts += 1
        self._change(trial.previous)
        self.span = trial.baseline
        return True

    def _change(self, counts: dict[str, int]) -> None:
        self._apply(counts)
        self._since_change = 0
        self.changes += 1

    def _key(self, counts: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(counts[a] for a in self.agents)

    def step_seconds(self, counts: Mapping[str, int]) -> float:
        """The modelled rollout time of one step under `counts` hosts per agent."""
        return rollout_makespan(self.agents, self.parents, self.demand, counts)

    def _search(self, cur: dict[str, int]) -> dict[str, int] | None:
        """Move one host at a time while the modelled step gets shorter; the split found if
        it beats `cur` by `min_gain`, else None."""
        if len(self.demand) < len(self.agents):
            return None  # an agent has not reported yet
        best, best_s = cur, self.step_seconds(cur)
        start = best_s
        while True:
            moves = [
                _moved(best, d, t)
                for d in self.agents
                if best[d] > 1
                for t in self.agents
                if t != d
            ]
            found = min(
                ((self.step_seconds(c), c) for c in moves), key=lambda x: x[0], default=None
            )
            if found is None or found[0] >= best_s * (1 - 1e-9):
                break
            best_s, best = found
        gain = best_s < start * (1 - self.config.min_gain)
        return best if gain and self._key(best) not in self.rejected else None

    def _fold(self, step: dict[str, list[float]]) -> None:
        a = self.config.ema
        for agent, tasks in step.items():
            if not tasks:
                continue  # nothing of this agent in the step (e.g. all of it resumed)
            now = Demand(sum(tasks), len(tasks))
            old = self.demand.get(agent)
            self.demand[agent] = now if old is None else _blend(now, old, a)

    def _apply(self, counts: dict[str, int]) -> None:
        """Move the fewest hosts: surplus agents free their least-loaded hosts."""
        keep: dict[str, list[str]] = {}
        free: list[str] = []
        for ag in self.agents:
            hs = sorted(self.assignment[ag], key=lambda h: self.outstanding[h])
            surplus = len(hs) - counts[ag]
            free += hs[:surplus] if surplus > 0 else []
            kept = hs[surplus:] if surplus > 0 else hs
            keep[ag] = [h for h in self.assignment[ag] if h in kept]
        for ag in self.agents:
            while len(keep[ag]) < counts[ag]:
                keep[ag].append(free.pop(0))
        self.assignment = {ag: tuple(keep[ag]) for ag in self.agents}

    def place(self, agent: str, est_tokens: int) -> str:
        """The agent's next host in turn, unless another has more than one task's worth of
        tokens less outstanding (then the least loaded): a step's equal micro-batches spread
        over the hosts instead of queueing where a difference of a fraction of a task
        pointed them."""
        hs = self.hosts_of(agent)
        start = self._next.get(agent, 0) % len(hs)
        turn = hs[start]
        least = min(hs, key=lambda h: self.outstanding[h])
        host = least if self.outstanding[turn] - self.outstanding[least] > est_tokens else turn
        self._next[agent] = start + 1
        self.outstanding[host] += est_tokens
        return host


class NoBalancing(_HostBook):
    """The benchmark's "off" arm: static equal split, round-robin within an agent."""

    def __init__(self, agents: Sequence[str], hosts: Sequence[str]) -> None:
        super().__init__(agents, hosts)
        self._next = dict.fromkeys(agents, 0)

    def observe(
        self,
        agent: str,
        start: float,
        end: float,
        step: int = 0,
        *,
        demand: bool = True,
        startup: float = 0.0,
    ) -> None:
        self.hosts_of(agent)

    def end_step(self, step: int = 0) -> bool:
        return False

    def place(self, agent: str, est_tokens: int) -> str:
        hs = self.hosts_of(agent)
        host = hs[self._next[agent] % len(hs)]
        self._next[agent] += 1
        self.outstanding[host] += est_tokens
        return host
