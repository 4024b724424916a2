"""The pipeline lets go of finished steps: handles are dropped behind the window, and every
LINEAGE_CUT_EVERY steps a step gets its older inputs as values, so Dask can forget the
run's history (bench/soak.py measured what holding it cost)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from flows.cluster.start import Workers
from flows.orchestrator.pipeline import LINEAGE_CUT_EVERY, Pipeline
from meg import load_meg
from tasks.context import RunContext
from workloads import BUILTIN
from workloads.rewards import known_rewards


@dataclass(eq=False, repr=False)  # a repr would print the whole MEG of every task
class Task:
    kind: str
    kwargs: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.kwargs["step"])


@dataclass
class Steps:
    """Tasks of steps below `through` are finished; the test moves `through` along."""

    through: int = 0
    tasks: list[Task] = field(default_factory=list)

    def submit(self, kind: str, kwargs: dict[str, Any], pin: dict[str, Any]) -> Task:
        self.tasks.append(Task(kind, kwargs))
        return self.tasks[-1]

    def done(self, handle: Task) -> bool:
        return handle.step < self.through

    def results(self, handles: list[Task]) -> list[Any]:
        return [
            SimpleNamespace(
                step=h.step,
                agent=h.kwargs.get("agent", "planner"),
                node=h.kwargs.get("node"),  # a generate's node (the pipeline asks if a tool's)
                decode_tokens=0,
                score=None,  # a generate's fused score (one-node MEGs only)
                startup=0.0,  # a generate's seconds spent starting its engine
                timing=SimpleNamespace(start=0.0, end=0.0, seconds=0.0, step=h.step),
                task=h,
            )
            for h in handles
        ]

    def idle(self, seconds: float) -> None:
        """Nothing else will finish: a wait that got here would never end."""
        raise AssertionError(f"the pipeline waits for a task of step >= {self.through}")


def inputs(t: Task) -> list[Any]:
    """What a task waits on besides its own step's tasks: weights, `after`, `trains`."""
    return [t.kwargs.get("weights"), *t.kwargs.get("after", ()), *t.kwargs.get("trains", ())]


def test_old_handles_are_dropped_and_the_lineage_is_cut() -> None:
    spec = load_meg(BUILTIN["fanout"], known_rewards=known_rewards(), check_models=False)
    steps = LINEAGE_CUT_EVERY + 3
    spec = spec.with_run(mode="flex", steps=steps, episodes_per_step=4, micro_batches=2)
    ctx = RunContext("r", "memory://x", spec)
    workers = Workers("tcp://s", ("R",), ("T",), {w: {"resources": {w: 1}} for w in "RT"})
    ex = Steps()
    pipe = Pipeline(ctx, workers, ex)
    for k in range(steps):
        # step k-1 is still running when step k is submitted, except at a cut, where the
        # pipeline waits for it (it would hang here if it waited for anything newer)
        ex.through = k if k % LINEAGE_CUT_EVERY == 0 else k - 1
        pipe.wait_window(k)
        pipe.submit_rollout(k)
        pipe.submit_training(k)
        held = {key[1] for key in pipe.futures["generate"]}
        held |= {key[1] for key in pipe.futures["optimizer_step"]}
        assert min(held) >= k - 2, (k, sorted(held))  # window 2: steps k-2 .. k only
        older = [
            d
            for t in ex.tasks
            if t.step == k
            for d in inputs(t)
            if isinstance(d, Task) and d.step < k
        ]
        if k % LINEAGE_CUT_EVERY == 0:  # the cut: older steps come in as results
            assert len(older) == 0, k
            weights = [
                t.kwargs["weights"] for t in ex.tasks if t.step == k and t.kind == "generate"
            ]
            if k:
                assert all(isinstance(w, SimpleNamespace) and w.step == k - 1 for w in weights)
        else:  # in between, step k depends on step k-1's tasks (they still run)
            assert k == 0 or older, k
    ex.through = steps
    assert len(pipe.finish()) == len(ex.tasks)
