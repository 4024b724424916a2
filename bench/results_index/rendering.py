"""`render`: every entry refreshed from its JSON into the index, the index into the pages'
markers and the results table."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from bench.results_index.model import (
    INDEX,
    MARKER_RE,
    ROOT,
    TABLE_BEGIN,
    TABLE_END,
    Index,
    dump_index,
    load_index,
)
from bench.results_index.values import Missing, marker_text, read_json, refreshed


def render_table(index: Index) -> str:
    """The index as a table for docs/benchmarks.md: every headline with its provenance."""
    rows = [
        "| headline | value | spread | script: file, key | date, machine | repeats | beside it |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in index.results:
        rows.append(
            f"| {r.label} | **{r.shown}** | {r.spread or '—'} | `{r.script}`: "
            f"`{Path(r.file).name}`, `{r.key}` | {r.date}, {r.machine} | "
            f"{r.repeats if r.repeats is not None else '—'} | {r.caveat or ''} |"
        )
    return "\n".join(rows)


def render_page(text: str, index: Index) -> str:
    def one(m: re.Match[str]) -> str:
        r = index.by_id.get(m["id"])
        shown = marker_text(r, bool(m["field"])) if r else None
        if shown is None:
            return m[0]
        return m.string[m.start() : m.start("text")] + shown + m.string[m.end("text") : m.end()]

    text = MARKER_RE.sub(one, text)
    if TABLE_BEGIN in text and TABLE_END in text:
        head, rest = text.split(TABLE_BEGIN, 1)
        tail = rest.split(TABLE_END, 1)[1]
        # blank lines around the table: Python-Markdown would take a table right after a
        # comment line for the comment's raw HTML block
        text = f"{head}{TABLE_BEGIN}\n\n{render_table(index)}\n\n{TABLE_END}{tail}"
    return text


def render(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """Refresh every entry from its JSON, write the index, then the pages. Returns (files
    changed, entries that could not be read: left as they were)."""
    index = load_index(root)
    results, failed = [], []
    for r in index.results:
        try:
            results.append(refreshed(r, read_json(root / r.file)))
        except (Missing, ValueError) as e:
            failed.append(f"{r.id}: {e}")
            results.append(r)
    index = replace(index, results=tuple(results), by_id={})
    changed = []
    targets = [(root / INDEX, dump_index(index))]
    for page in index.pages:
        if (root / page).exists():
            targets.append((root / page, render_page((root / page).read_text(), index)))
    for path, new in targets:
        if path.read_text() != new:
            path.write_text(new)
            changed.append(str(path.relative_to(root)))
    return changed, failed
