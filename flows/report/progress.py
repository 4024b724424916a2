"""Progress output of a run: one live table per agent (step, version, reward, stage).

On a terminal it is a rich Live table; elsewhere (CI, a Prefect worker's log) it prints one
line per finished optimizer step, so logs stay readable. A Prefect progress artifact follows
the finished steps, updated at most once a second (`ARTIFACT_EVERY_S`) and once at the end.

Why throttle: each update is a request the Prefect server writes to its database. At the
TRL peer job's several steps a second, updating on every step took server CPU the run's own
workers then lacked (docs/cli.md#what-a-run-writes). The UI's progress bar gains
nothing from more than one update a second.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tasks.refs import GenRef, HandOverRef, RewardSum, ScoreRef, StepRef, TrainRef

ARTIFACT_EVERY_S = 1.0  # seconds between two updates of the progress artifact (docstring)


class Progress:
    def __init__(
        self,
        agents: list[str],
        steps: int,
        start_step: int = 0,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.agents, self.steps, self.start = agents, steps, start_step
        self.console = console or Console(stderr=True)
        self.live_mode = self.console.is_terminal and sys.stderr.isatty()
        self.state: dict[str, dict[str, Any]] = {
            a: {
                "step": "-",
                "version": 0,
                "reward": float("nan"),
                "tokens": 0,
                "failed": 0,
                "stage": "waiting",
            }
            for a in agents
        }
        self.team: dict[int, RewardSum] = defaultdict(RewardSum)
        self.steps_done = 0
        self._live: Live | None = None
        self._artifact: Any = None
        self._clock = clock
        self._reported: tuple[float, int] | None = None  # (when, steps_done) of the last update

    def __enter__(self) -> Progress:
        if self.live_mode:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        try:
            from prefect.artifacts import create_progress_artifact

            self._artifact = create_progress_artifact(
                progress=0.0, key="flexmarl-progress", description="finished optimizer steps, %"
            )
        except Exception:  # outside a flow run (e.g. the plain Dask executor): no artifact
            self._artifact = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._reported is not None and self._reported[1] != self.steps_done:
            with suppress(Exception):  # never hide the error a failing run is raising
                self._report()  # the steps finished since the last (throttled) update
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _report(self) -> None:
        """Update the progress artifact to the finished agent-steps."""
        from prefect.artifacts import update_progress_artifact

        total = self.steps * len(self.agents)
        update_progress_artifact(self._artifact, progress=100.0 * self.steps_done / total)
        self._reported = (self._clock(), self.steps_done)

    def _table(self) -> Table:
        t = Table(title=f"flexmarl: {self.steps_done}/{self.steps} agent-steps done")
        for col in ("agent", "step", "version", "reward", "tokens", "failed", "stage"):
            t.add_column(col, justify="left" if col in ("agent", "stage") else "right")
        for a in self.agents:
            s = self.state[a]
            t.add_row(
                a,
                str(s["step"]),
                str(s["version"]),
                f"{s['reward']:.3f}",
                str(s["tokens"]),
                str(s["failed"]),
                s["stage"],
            )
        return t

    def __call__(self, kind: str, ref: Any) -> None:
        if isinstance(ref, GenRef):
            s = self.state[ref.agent]
            s["tokens"] += ref.decode_tokens
            s["stage"] = f"generated {ref.node} k={ref.step} mb={ref.micro_batch}"
        elif isinstance(ref, ScoreRef):
            self.team[ref.step] += ref.team
            for a, r in ref.agent_reward.items():
                if r.mean is not None:
                    self.state[a]["reward"] = r.mean
            for a, n in ref.failed.items():
                self.state[a]["failed"] += n
        elif isinstance(ref, TrainRef):
            self.state[ref.agent]["stage"] = f"trained k={ref.step} mb={ref.micro_batch}"
        elif isinstance(ref, StepRef):
            s = self.state[ref.agent]
            s.update(step=ref.step, version=ref.version, stage=f"stepped k={ref.step}")
            self.steps_done += 1
            self._on_step(ref)
        elif isinstance(ref, HandOverRef):
            self.state[ref.agent]["stage"] = f"moved k={ref.step}"
            self.console.print(
                f"[step {ref.step}] {ref.agent}: training moved {ref.source} -> {ref.target} "
                f"({ref.nbytes / 2**20:.1f} MiB of state, elastic allocation)",
                markup=False,
            )
        if self._live is not None:
            self._live.update(self._table())

    def _on_step(self, ref: StepRef) -> None:
        if self._artifact is not None and self._due():
            self._report()
        if not self.live_mode:
            team = self.team[ref.step].mean
            tr = f" team reward {team:.3f}" if team is not None else ""
            failed = self.state[ref.agent]["failed"]
            tr += f", {failed} failed reward calls so far" if failed else ""
            self.console.print(
                f"[step {ref.step}] {ref.agent}: version {ref.version}, loss {ref.loss:.4f}"
                f"{' (skipped: non-finite)' if ref.skipped else ''}{tr}",
                markup=False,
                highlight=False,
            )

    def _due(self) -> bool:
        """Whether the artifact is updated now: every agent has finished the same number of
        steps, and this is the first or the last step, or a second has passed since the last
        update."""
        if self.steps_done % len(self.agents):
            return False
        if self.steps_done == self.steps * len(self.agents) or self._reported is None:
            return True
        return self._clock() - self._reported[0] >= ARTIFACT_EVERY_S
