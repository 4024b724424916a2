"""A test double of the elastic allocation *policy* only, and a CLI entry that runs
`flexmarl` with it: `python -m tests.flows.scripted_allocator AWAY ARGS...` is `flexmarl ARGS...`
where AWAY (JSON, a list of [unit or null, step]) says which unit trains on the rollout
worker in which step.

The real policy (`engines.training.allocation.ElasticAllocator`) decides from measured
seconds, so whether and when it moves depends on the machine: a test that needs a move at a
known step (a SIGKILL during a handover) scripts the decision and keeps everything else real
(the handover, the tasks, the cluster). The policy itself is tested as a pure object and in
the simulator."""

from __future__ import annotations

import json
import sys
from collections.abc import Set as AbstractSet
from typing import Any

from engines.training.allocation import Move

Away = AbstractSet[tuple[str | None, int]]


def scripted(away: Away) -> type:
    """Unit U trains on the rollout worker in step k when (U, k) — or (None, k), every unit
    — is in `away`, else on the training worker; every move is known in advance."""

    class ScriptedAllocator:
        def __init__(self, units: Any, train: Any, rollout: Any, config: Any = None) -> None:
            self.units, self.train, self.rollout = list(units), train[0], rollout[0]

        def worker_of(self, unit: str, step: int) -> str:
            moved = (unit, step) in away or (None, step) in away
            return self.rollout if moved else self.train

        def observe(self, worker: str, unit: str | None, seconds: float, step: int) -> None:
            pass

        def end_step(self, step: int, end: float) -> Move | None:
            """The first unit whose worker changes from step to step + 1, as the real
            policy reports its (one) move for the run's log."""
            for unit in self.units:
                source, target = self.worker_of(unit, step), self.worker_of(unit, step + 1)
                if source != target:
                    return Move(unit, source, target)
            return None

    return ScriptedAllocator


def main(argv: list[str]) -> int:
    import flows.orchestrator.placement as placement
    from flows.cli.main import main as flexmarl

    away: Away = {(unit, int(step)) for unit, step in json.loads(argv[0])}
    placement.ElasticAllocator = scripted(away)  # type: ignore[misc,assignment]
    return flexmarl(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
