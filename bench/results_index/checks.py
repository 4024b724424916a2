"""The checks `check` runs: (c) the index against its JSON, (d) one key, one value among a
benchmark's files, and the pages' (a) unmarked numbers and (b) markers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from bench.results_index.model import (
    INDEX,
    MARKER_RE,
    NUMBER_RE,
    RESULTS,
    ROOT,
    TABLE_BEGIN,
    TABLE_END,
    Index,
    Result,
    load_index,
)
from bench.results_index.rendering import render_table
from bench.results_index.values import Missing, lookup, marker_text, read_json, refreshed, vendor

# ---- (c) the index against its JSON ---------------------------------------------------------


def json_problems(root: Path, index: Index) -> list[str]:
    out = []
    for r in index.results:
        where = f"{r.id} ({r.file} {r.key})"
        if r.script.endswith(".py") and not (root / r.script).exists():
            out.append(f"{r.id}: script {r.script} does not exist")
        if r.file in index.superseded:
            out.append(f"{where}: reads a file the index lists as superseded")
        try:
            data = read_json(root / r.file)
            new = refreshed(r, data)
        except (Missing, ValueError) as e:
            out.append(f"{where}: {e}")
            continue
        for name in ("shown", "spread", "date", "repeats"):
            if getattr(new, name) != getattr(r, name):
                said, is_ = getattr(r, name), getattr(new, name)
                out.append(f"{where}: the index says {name} {said!r}, the JSON {is_!r}")
        said_vendor = vendor(r.machine)
        json_vendor = vendor(str(data.get("cpu", ""))) or vendor(str(data.get("machine", "")))
        if json_vendor and said_vendor != json_vendor:
            out.append(f"{where}: machine {r.machine!r}, but the JSON ran on {json_vendor}")
    return out


# ---- (d) one key, one value, among a benchmark's files --------------------------------------


def siblings(root: Path, r: Result, index: Index) -> list[str]:
    """The files one benchmark wrote: `<name>.json` and its reruns `<name>_<variant>.json`
    for the script `bench/<name>.py` (or the package `bench/<name>/`), and the files other
    entries of the same script read. Compared within a benchmark only: keys such as
    `wall_s` or `team_reward` mean different things in different benchmarks' files. Raw
    per-run dumps (folders, and `e2e_runs.json`, the reference run's packed) are not result
    files."""
    p = Path(r.script)
    name = p.parent.name if p.stem == "__main__" else p.stem
    files = {e.file for e in index.results if e.script == r.script}
    if r.script.startswith("bench/") and r.script.endswith(".py"):
        for f in sorted((root / RESULTS).glob("*.json")):
            if f.stem.endswith("_runs"):  # runs packed by bench.packed
                continue
            if f.stem == name or f.stem.startswith(name + "_"):
                files.add(str(f.relative_to(root)))
    files.discard(str(INDEX))
    return sorted(files - {r.file})


def duplicate_problems(root: Path, index: Index) -> list[str]:
    declared = {(r.file, r.key) for r in index.results}
    out = []
    for r in index.results:
        try:
            mine = dict(lookup(read_json(root / r.file), r.key))
        except Missing:
            continue  # json_problems says so
        for other in siblings(root, r, index):
            if other in index.superseded or (other, r.key) in declared:
                continue
            try:
                theirs = dict(lookup(read_json(root / other), r.key))
            except Missing:
                continue
            for path, value in theirs.items():
                if path in mine and mine[path] != value:
                    out.append(
                        f"{r.id}: {path} is {mine[path]} in {r.file} but {value} in {other}; "
                        "one current file per result: delete the superseded file, list it "
                        "under `superseded`, or show its value as an entry of its own"
                    )
    for f in index.superseded:
        if not (root / f).exists():
            out.append(f"superseded {f}: no such file (drop it from the list)")
    return out


# ---- the pages: (a) unmarked numbers, (b) markers --------------------------------------------


def markers(text: str) -> Iterator[re.Match[str]]:
    return MARKER_RE.finditer(text)


def section(text: str, title: str) -> str | None:
    """The body of `## title` up to the next `## ` heading (None: no such heading)."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m[1] if m else None


def unmarked_numbers(text: str, phrases: Iterable[str]) -> list[str]:
    """Result-looking numbers in `text` outside markers, code spans, link targets and HTML
    comments, once the setup phrases (targets, model sizes) are taken out."""
    text = MARKER_RE.sub(" ", text)
    text = re.sub(r"<!--.*?-->|`[^`]*`|\]\([^)]*\)", " ", text, flags=re.S)
    text = re.sub(r"\s+", " ", text)
    for phrase in phrases:
        text = text.replace(phrase, " ")
    return [m[0] for m in NUMBER_RE.finditer(text)]


def blocks(text: str) -> Iterator[str]:
    """A page's bullets, table rows and paragraphs: where a number and its bad news must
    stand together."""
    block: list[str] = []
    for line in text.splitlines():
        starts = line.startswith(("- ", "* ", "|", "#")) or not line.strip()
        if starts and block:
            yield "\n".join(block)
            block = []
        if line.strip():
            block.append(line)
    if block:
        yield "\n".join(block)


def page_problems(root: Path, index: Index) -> list[str]:
    out = []
    used: set[str] = set()
    for page in index.pages:
        path = root / page
        if not path.exists():
            out.append(f"{page}: no such page")
            continue
        text = path.read_text()
        for m in markers(text):
            line = text.count("\n", 0, m.start()) + 1
            name = m["id"] + (":spread" if m["field"] else "")
            used.add(m["id"])
            r = index.by_id.get(m["id"])
            if r is None:
                out.append(f"{page}:{line}: marker {name!r} is in no index entry")
            elif m["text"] != marker_text(r, bool(m["field"])):
                shown = marker_text(r, bool(m["field"]))
                out.append(f"{page}:{line}: {name} shows {m['text']!r}, the index {shown!r}")
            if not text[text.rfind("\n", 0, m.start()) + 1 : m.start()].strip():
                out.append(
                    f"{page}:{line}: marker {name} begins a line: Python-Markdown takes it "
                    "for a block comment and breaks the paragraph; rewrap the line"
                )
        if TABLE_BEGIN in text:
            table = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
            if table.strip() != render_table(index).strip():
                out.append(f"{page}: the results index table is stale (run render)")
    for r in index.results:
        if r.id not in used:
            out.append(f"{r.id}: on no page (drop the entry or show it)")
        for w in r.shown_with:
            if w.removesuffix(":spread") not in index.by_id:
                out.append(f"{r.id}: shown_with names {w!r}, which is no entry")
    readme = root / index.readme
    text = readme.read_text() if readme.exists() else ""
    for block in blocks(text):
        here = {m["id"] + (":spread" if m["field"] else "") for m in markers(block)}
        for name in sorted(here):
            r = index.by_id.get(name)
            missing = [w for w in r.shown_with if w not in here] if r else []
            if missing:
                out.append(
                    f"{index.readme}: {name} stands without {', '.join(missing)} (its bad "
                    f"news) in {block.splitlines()[0][:60]!r}..."
                )
    for title in index.headline_sections:
        body = section(text, title)
        if body is None:
            out.append(f"{index.readme}: no section '## {title}'")
            continue
        for n in unmarked_numbers(body, index.setup_phrases):
            out.append(f"{index.readme} '## {title}': {n!r} is not inside a results marker")
    return out


def problems(root: Path = ROOT) -> list[str]:
    """Everything `check` reports."""
    index = load_index(root)
    return json_problems(root, index) + duplicate_problems(root, index) + page_problems(root, index)
