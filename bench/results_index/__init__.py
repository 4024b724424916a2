"""One results index: every headline number of the front pages, where it was measured, and
the checks that keep the pages, the index and the benchmarks' JSON saying the same thing.

Why: the front pages (README.md, its site copy docs/index.md, docs/benchmarks.md) quoted
results by hand, and a reader found them drifting: a ratio of superseded code kept after a
rerun, the fast half of a run whose held-out pass rate fell, two files giving one key two
values. Now each headline number is an entry of `bench/results/index.json` (`Result`: the
script, the JSON file and the dotted key path in it, the value as shown, date, machine,
repeats, spread, the caveat shown beside it), and the pages carry it between markers,
`<!-- r:ID -->1.28<!-- /r -->`, which GitHub and mkdocs both render as the bare number.

    python -m bench.results_index render   # values, spreads, dates from the JSON into the
                                           # index, then the index into the pages
    python -m bench.results_index check    # exit 1 with one line per problem

`check` finds (a) a result-looking number in the README's headline sections outside a
marker, (b) a marker whose text is not its entry's value (or whose id is in no entry), an
entry on no page, a bad news entry (`shown_with`) missing from its good news' bullet, (c) an
entry its JSON disagrees with (file, key, value at its rounding, spread, date, repeats,
processor vendor), and (d) a key an entry reads holding another value in a sibling file of
the same benchmark that the index does not declare. Values are read with `parse_float=
Decimal` and rounded half up, as a person rounds the printed digits. No pickle: the index is
JSON that a person edits.
"""

from __future__ import annotations

from bench.results_index.checks import (
    blocks,
    duplicate_problems,
    json_problems,
    markers,
    page_problems,
    problems,
    section,
    siblings,
    unmarked_numbers,
)
from bench.results_index.cli import main
from bench.results_index.model import (
    DASH,
    FMT_RE,
    INDEX,
    MARKER_RE,
    MINUS,
    NUMBER_RE,
    RESULTS,
    ROOT,
    TABLE_BEGIN,
    TABLE_END,
    Agg,
    Index,
    Number,
    Result,
    Spread,
    dump_index,
    load_index,
)
from bench.results_index.rendering import render, render_page, render_table
from bench.results_index.values import (
    Missing,
    _children,
    fmt_number,
    fmt_range,
    lookup,
    marker_text,
    read_json,
    refreshed,
    shown_value,
    spread_value,
    vendor,
)

__all__ = [
    "DASH",
    "FMT_RE",
    "INDEX",
    "MARKER_RE",
    "MINUS",
    "NUMBER_RE",
    "RESULTS",
    "ROOT",
    "TABLE_BEGIN",
    "TABLE_END",
    "Agg",
    "Index",
    "Missing",
    "Number",
    "Result",
    "Spread",
    "_children",
    "blocks",
    "dump_index",
    "duplicate_problems",
    "fmt_number",
    "fmt_range",
    "json_problems",
    "load_index",
    "lookup",
    "main",
    "marker_text",
    "markers",
    "page_problems",
    "problems",
    "read_json",
    "refreshed",
    "render",
    "render_page",
    "render_table",
    "section",
    "shown_value",
    "siblings",
    "spread_value",
    "unmarked_numbers",
    "vendor",
]
