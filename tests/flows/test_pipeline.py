"""The compiler's task graph, read off a recording executor: edges, score groups, priorities.

The executor here only records what the compiler submits (nothing runs); the same graph
runs on real Prefect/Dask in test_train.py. `StepLog` is tested on real threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from prefect.logging import disable_run_logger

from flows.cluster.start import Workers
from flows.orchestrator.futures import StepLog, WatchUnit
from flows.orchestrator.pipeline import Pipeline, task_priority
from flows.orchestrator.placement import need_order
from flows.orchestrator.step_tasks import watch_steps
from meg import build_spec, load_meg, topological_order, validate
from tasks.context import RunContext, Timing
from tasks.refs import StepRef
from workloads import BUILTIN
from workloads.rewards import known_rewards


@dataclass(eq=False)
class Task:
    kind: str
    kwargs: dict[str, Any]
    priority: int
    worker: str

    @property
    def after(self) -> set[int]:
        deps = (*self.kwargs.get("after", ()), *self.kwargs.get("trains", ()))
        if self.kwargs.get("weights") is not None:
            deps = (*deps, self.kwargs["weights"])
        return {id(d) for d in deps}


@dataclass
class Recorder:
    tasks: list[Task] = field(default_factory=list)

    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Task:
        (worker,) = pin["resources"]
        self.tasks.append(Task(kind, kwargs, pin["priority"], worker))
        return self.tasks[-1]

    def done(self, handle: Any) -> bool:
        return False

    def results(self, handles: list[Any]) -> list[Any]:
        raise AssertionError("nothing runs here")

    def idle(self, seconds: float) -> None:
        raise AssertionError("nothing runs here: the pipeline would wait forever")


def compile_steps(workload: str, mode: str, steps: int = 2, mb: int = 2) -> Pipeline:
    spec = load_meg(BUILTIN[workload], known_rewards=known_rewards(), check_models=False)
    spec = spec.with_run(mode=mode, steps=steps, episodes_per_step=4, micro_batches=mb)
    ctx = RunContext("r", "memory://x", spec)
    workers = Workers("tcp://s", ("R",), ("T",), {w: {"resources": {w: 1}} for w in "RT"})
    pipe = Pipeline(ctx, workers, Recorder())
    for k in range(steps):
        pipe.submit_rollout(k)
        pipe.submit_training(k)
    return pipe


def test_flex_scores_each_group_as_soon_as_it_can_and_trains_on_it() -> None:
    p = compile_steps("fanout", "flex")
    ids = lambda *hs: {id(h) for h in hs}  # noqa: E731
    for k in range(2):
        for j in range(2):
            # micro-batches flow through each node in order
            if j:
                assert (
                    id(p.futures["generate"][("plan", k, 0)])
                    in p.futures["generate"][("plan", k, 1)].after
                )
            # a worker's group waits only for that worker's node ...
            work_s = next(
                h for (kk, jj, g), h in p.futures["score"].items() if (kk, jj) == (k, j) and g == 0
            )
            assert work_s.kwargs["group"].nodes == ("work_s",)
            assert work_s.after == ids(p.futures["generate"][("work_s", k, j)])
            # ... so `short` trains without waiting for the aggregate; the planner must wait
            assert ids(work_s) <= p.futures["train_micro_batch"][("short", k, j)].after
            team = p.futures["score"][(k, j, 3)]
            assert team.kwargs["group"].nodes == ("plan", "aggregate")
            assert team.after == ids(p.futures["generate"][("aggregate", k, j)])
            assert ids(team) <= p.futures["train_micro_batch"][("planner", k, j)].after
            assert not ids(team) & p.futures["train_micro_batch"][("short", k, j)].after
    # zero staleness per agent: step-1 generation waits for its own agent's step 0 only
    assert p.futures["generate"][("work_s", 1, 0)].after == ids(
        p.futures["generate"][("plan", 1, 0)], p.futures["optimizer_step"][("short", 0)]
    )
    # placement: rollout and scoring on the rollout worker, training on the training worker
    kinds = {(t.kind, t.worker) for t in p.executor.tasks}  # type: ignore[attr-defined]
    assert kinds == {
        ("generate", "R"),
        ("score", "R"),
        ("train_micro_batch", "T"),
        ("optimizer_step", "T"),
    }


def test_the_first_two_micro_batches_train_in_either_order_the_rest_in_order() -> None:
    """Train(A, k, 1) does not wait for train(A, k, 0) (their gradient sum commutes); from
    the third on each waits for every earlier one; the step waits for all of them."""
    p = compile_steps("fanout", "flex", mb=4)
    trains = p.futures["train_micro_batch"]
    for agent in p.agents:
        for k in range(2):
            t = [trains[(agent, k, j)] for j in range(4)]
            assert not {id(t[0])} & t[1].after and not {id(t[1])} & t[0].after
            assert {id(t[0]), id(t[1])} <= t[2].after
            assert {id(t[0]), id(t[1]), id(t[2])} <= t[3].after
            assert {id(x) for x in t} <= p.futures["optimizer_step"][(agent, k)].after
            if k:  # every micro-batch of step 1 starts from step 0's result
                step0 = id(p.futures["optimizer_step"][(agent, 0)])
                assert all(step0 in x.after for x in t)


def test_sync_scores_once_per_micro_batch_behind_a_barrier() -> None:
    p = compile_steps("fanout", "sync")
    assert len(p.futures["score"]) == 2 * 2  # steps × micro-batches
    step0 = {id(h) for (k, _, _), h in p.futures["score"].items() if k == 0}
    for agent in p.agents:
        assert (
            step0 <= p.futures["train_micro_batch"][(agent, 0, 0)].after
        )  # every score of the step
    barrier = {id(p.futures["optimizer_step"][(a, 0)]) for a in p.agents}
    assert barrier <= p.futures["generate"][("plan", 1, 0)].after  # every agent's step 0


def test_priorities_put_earlier_steps_micro_batches_and_needed_agents_first() -> None:
    p = compile_steps("fanout", "flex")
    spec = p.ctx.spec
    order = topological_order(spec)
    assert p.agents == need_order(order, {n: spec.nodes[n].agent for n in order})
    assert p.agents == ["planner", "short", "medium", "long", "aggregator"]
    step0 = [t.priority for t in p.executor.tasks if t.kwargs["step"] == 0]  # type: ignore[attr-defined]
    step1 = [t.priority for t in p.executor.tasks if t.kwargs["step"] == 1]  # type: ignore[attr-defined]
    assert min(step0) > max(step1)
    assert min(
        h.priority for (_, k, j), h in p.futures["generate"].items() if (k, j) == (0, 0)
    ) > max(h.priority for (_, k, j), h in p.futures["generate"].items() if (k, j) == (0, 1))
    # the planner's micro-batches and step before the short worker's, before the aggregator's
    rank = {a: p.futures["optimizer_step"][(a, 0)].priority for a in p.agents}
    assert rank["planner"] > rank["short"] > rank["aggregator"]
    assert (
        p.futures["train_micro_batch"][("planner", 0, 1)].priority
        > p.futures["train_micro_batch"][("short", 0, 0)].priority
    )
    assert task_priority(0, 10**5) > task_priority(1, 0)


def test_step_log_hands_over_results_or_the_failure() -> None:
    log = StepLog(3, expected=2)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.extend(log.wait()))
    t.start()
    log.add("a")
    assert t.is_alive()  # still one result short
    log.add("b")
    t.join(timeout=10)
    assert got == ["a", "b"]
    failed = StepLog(4, expected=5)
    failed.fail(ValueError("worker died"))
    with pytest.raises(RuntimeError, match="step 4 failed: worker died"):
        failed.wait()


def test_a_watch_unit_takes_the_steps_of_its_first_second() -> None:
    """The driver adds each step's log to the open unit while the unit is younger than its
    seconds; the watcher takes them in order. Past its time the unit refuses the next step
    (which opens a new unit) and closes, keeping the steps already added."""
    now = [0.0]
    logs = [StepLog(k, expected=1) for k in range(4)]
    unit = WatchUnit(0, logs[0], seconds=1.0, clock=lambda: now[0])
    now[0] = 0.4
    assert unit.add(logs[1])
    assert unit.next() is logs[0] and unit.next() is logs[1]
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(unit.next()))
    t.start()
    t.join(timeout=0.2)
    assert t.is_alive()  # waits for the driver's next step
    now[0] = 0.8
    assert unit.add(logs[2])
    t.join(timeout=10)
    assert got == [logs[2]]
    now[0] = 0.9
    assert unit.add(logs[3])
    now[0] = 1.0
    assert not unit.add(StepLog(4, expected=1))  # a second on: step 4 opens a new unit
    assert unit.next() is logs[3] and unit.next() is None
    ended = WatchUnit(5, StepLog(5, expected=1), seconds=3600.0)
    ended.close()  # the run's last unit, closed by the driver
    assert not ended.add(StepLog(6, expected=1))


def test_a_watcher_covers_its_units_steps() -> None:
    """`watch_steps` (the Prefect task's body) summarises each step of its unit until the
    unit is closed: steps a second apart get one each; a failed step fails it and closes
    the unit."""

    def done(k: int) -> StepLog:
        log = StepLog(k, expected=1)
        timing = Timing("optimizer_step", "a", k, -1, "tcp://w", 0.0, 0.1)
        log.add(StepRef("a", k, k + 1, False, 0.5, 1.0, False, timing))
        return log

    with disable_run_logger():  # the body outside a task run: Prefect's null run logger
        now = [0.0]
        alone = WatchUnit(0, done(0), seconds=1.0, clock=lambda: now[0])
        now[0] = 1.2
        assert not alone.add(done(1))  # a step 1.2 s later: a task run of its own
        assert [s["step"] for s in watch_steps.fn(0, alone)] == [0]
        shared = WatchUnit(2, done(2), seconds=3600.0)
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.extend(watch_steps.fn(2, shared)))
        t.start()
        assert shared.add(done(3))
        shared.close()
        t.join(timeout=10)
        assert [(s["step"], s["versions"]) for s in got] == [(2, {"a": 3}), (3, {"a": 4})]
        failed = StepLog(5, expected=1)
        failed.fail(ValueError("worker died"))
        broken = WatchUnit(5, failed, seconds=3600.0)
        with pytest.raises(RuntimeError, match="step 5 failed"):
            watch_steps.fn(5, broken)
        assert not broken.add(done(6))


def test_agents_sharing_a_base_are_placed_together() -> None:
    """LoRA agents on one model are one weight unit: the balancer splits hosts among units
    and a unit trains on one worker, so the shared base is resident once per worker."""
    data = yaml.safe_load(BUILTIN["fanout"].read_text())
    for agent in ("planner", "short", "medium", "long"):
        data["agents"][agent]["lora"] = True
    spec = validate(build_spec(data), known_rewards=known_rewards(), check_models=False)
    spec = spec.with_run(mode="flex", steps=1, episodes_per_step=4, micro_batches=2)
    ctx = RunContext("r", "memory://x", spec)
    pins = {w: {"resources": {w: 1}} for w in ("R0", "R1", "T0", "T1")}
    workers = Workers("tcp://s", ("R0", "R1"), ("T0", "T1"), pins)
    rec = Recorder()
    pipe = Pipeline(ctx, workers, rec)
    pipe.submit_rollout(0)
    pipe.submit_training(0)
    shared = "planner+short+medium+long"
    assert pipe.place.unit == {a: shared for a in ("planner", "short", "medium", "long")} | {
        "aggregator": "aggregator"
    }
    assert set(pipe.place.balancer.assignment) == {shared, "aggregator"}  # 2 units, not 5 agents
    trains = {
        t.kwargs["agent"]: t.worker
        for t in rec.tasks
        if t.kind in ("train_micro_batch", "optimizer_step")
    }
    assert len({trains[a] for a in ("planner", "short", "medium", "long")}) == 1
    assert trains["aggregator"] != trains["planner"]  # units round-robin over the workers

    def workers_of(unit: str) -> set[str]:
        return {h.rsplit("#", 1)[0] for h in pipe.place.balancer.assignment[unit]}

    gens = [t for t in rec.tasks if t.kind == "generate"]
    for t in gens:  # every generate runs on a worker that hosts its agent's unit
        assert t.worker in workers_of(pipe.place.unit[spec.nodes[t.kwargs["node"]].agent]), t.kwargs
    assert {t.worker for t in gens if t.kwargs["node"] != "aggregate"} <= workers_of(shared)


@pytest.mark.parametrize("rollers", [("R",), ("R0", "R1", "R2", "R3")])
def test_a_nodes_micro_batches_are_ordered_where_they_share_a_worker(
    rollers: tuple[str, ...],
) -> None:
    """generate(node, k, 1) waits for generate(node, k, 0) on one worker, where the edge
    keeps micro-batches from interleaving; on two workers the two run side by side (with
    balancing off, 4 rollout workers give each of math-chain's 2 agents 2 workers)."""
    spec = load_meg(BUILTIN["math-chain"], known_rewards=known_rewards(), check_models=False)
    spec = spec.with_run(steps=2, episodes_per_step=4, micro_batches=2, balance=False)
    ctx = RunContext("r", "memory://x", spec)
    names = (*rollers, "T")
    workers = Workers("tcp://s", rollers, ("T",), {w: {"resources": {w: 1}} for w in names})
    rec = Recorder()
    pipe = Pipeline(ctx, workers, rec)
    for k in range(2):
        pipe.submit_rollout(k)
    gens = {
        (t.kwargs["node"], t.kwargs["step"], t.kwargs["mb"]): t
        for t in rec.tasks
        if t.kind == "generate"
    }
    for node in pipe.order:
        for k in range(2):
            first, second = gens[(node, k, 0)], gens[(node, k, 1)]
            apart = first.worker != second.worker
            assert apart == (len(rollers) > 1), (node, first.worker, second.worker)
            assert (id(first) in second.after) != apart


@pytest.mark.parametrize("mode", ["flex", "sync", "async"])
def test_a_one_node_meg_scores_inside_its_generate_task(mode: str, tmp_path: Any) -> None:
    """`fused_scores`: no score task; the generate task carries the group, and training waits
    on the generate handle, which also stands for the score in the step's count."""
    from bench.peer_job import Job, meg_config

    path = meg_config(Job(4, 2, 8, 2), str(tmp_path / "no-model"), tmp_path)
    spec = load_meg(path, known_rewards=known_rewards(), check_models=False)
    spec = spec.with_run(mode=mode, staleness=1 if mode == "async" else 0)
    workers = Workers("tcp://s", ("R",), ("T",), {w: {"resources": {w: 1}} for w in "RT"})
    p = Pipeline(RunContext("r", "memory://x", spec), workers, Recorder())
    for k in range(2):
        p.submit_rollout(k)
        p.submit_training(k)
    assert {t.kind for t in p.executor.tasks} == {  # type: ignore[attr-defined]
        "generate",
        "train_micro_batch",
        "optimizer_step",
    }
    for k in range(2):
        for j in range(2):
            gen = p.futures["generate"][("solve", k, j)]
            assert gen.kwargs["score"].nodes == ("solve",)
            assert p.futures["score"][(k, j, 0)] is gen
            assert (
                id(gen)
                in p.futures["train_micro_batch"][("policy", k, j if mode != "sync" else 0)].after
            )
        # the step's results: 2 generates + 2 fused scores + 2 trains + 1 step
        assert len(p.futures.handles_of(k)) == 7


def test_larger_graphs_keep_their_score_tasks() -> None:
    p = compile_steps("math-chain", "flex")
    assert p.fused == {}
    assert all("score" not in t.kwargs for t in p.executor.tasks if t.kind == "generate")  # type: ignore[attr-defined]
