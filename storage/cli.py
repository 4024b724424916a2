"""Text output for ``flexmarl store ls|show`` (wired into argparse by flows/cli/main.py).

Both functions return a string (a rich table rendered to text, or JSON) so they are
testable without a terminal; user mistakes raise StoreError naming the path.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table as RichTable

from storage.errors import StoreError
from storage.store import MEGStore


def _render(table: RichTable) -> str:
    console = Console(width=160, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def _span(values: list[int]) -> str:
    return (
        "-"
        if not values
        else (f"{min(values)}" if min(values) == max(values) else f"{min(values)}..{max(values)}")
    )


def store_ls(url: str, storage_options: dict[str, Any] | None = None, as_json: bool = False) -> str:
    """Runs, agents, steps, segments, rows and policy versions of every table under ``url``."""
    runs = MEGStore.runs(url, storage_options)
    if not runs:
        raise StoreError(f"no MEG store runs under {url} (no <run>/store.json found)")
    summary: list[dict[str, Any]] = []
    for run in runs:
        store = MEGStore.open(url, run, create=False, storage_options=storage_options)
        for agent in store.agents():
            infos = store.table(agent).segments()
            summary.append(
                {
                    "run": run,
                    "agent": agent,
                    "steps": sorted({i.step for i in infos}),
                    "segments": len(infos),
                    "rows": sum(i.rows for i in infos),
                    "versions": sorted({v for i in infos for v in i.versions}),
                    "consumed_steps": sorted(store.table(agent).consumption_log()),
                }
            )
    if as_json:
        return json.dumps(summary, indent=1)
    t = RichTable(title=f"MEG store {url}")
    for col in ("run", "agent", "steps", "segments", "rows", "versions", "consumed"):
        t.add_column(col)
    for s in summary:
        t.add_row(
            s["run"],
            s["agent"],
            _span(s["steps"]),
            str(s["segments"]),
            str(s["rows"]),
            _span(s["versions"]),
            str(len(s["consumed_steps"])),
        )
    return _render(t)


def store_show(
    url: str,
    run: str,
    agent: str,
    step: int | None = None,
    as_json: bool = False,
    storage_options: dict[str, Any] | None = None,
    limit: int = 50,
) -> str:
    """Rows of one table (optionally one step): ids, version, source, lengths, reward,
    advantage."""
    store = MEGStore.open(url, run, create=False, storage_options=storage_options)
    if agent not in store.agents():
        raise StoreError(f"no table {agent!r} in {url}/{run}; tables: {store.agents()}")
    b = store.table(agent).read(step=step)
    rows = [
        {
            "sample_id": str(b.sample_id[i]),
            "node": str(b.node[i]),
            "step": int(b.step[i]),
            "version": int(b.policy_version[i]),
            "source": str(b.source[i]) or "self",  # or the external policy that sampled it
            "prompt_len": int(b.prompt_lengths[i]),
            "response_len": int(b.response_lengths[i]),
            "reward": None if np.isnan(b.reward[i]) else float(b.reward[i]),
            "advantage": None if np.isnan(b.advantage[i]) else float(b.advantage[i]),
            "finish": str(b.finish_reason[i]),
            "status": str(b.score_status[i]) or "unscored",  # ok | failed: why | dropped: why
        }
        for i in range(len(b))
    ]
    if as_json:
        return json.dumps(rows, indent=1)
    t = RichTable(
        title=f"{url}/{run}/{agent}"
        + ("" if step is None else f" step {step}")
        + f" — {len(rows)} rows"
        + (f", first {limit}" if len(rows) > limit else "")
    )
    for col in rows[0] if rows else ("sample_id",):
        t.add_column(col)
    for r in rows[:limit]:
        t.add_row(
            *(
                "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
                for v in r.values()
            )
        )
    return _render(t)
