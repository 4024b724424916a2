"""The index's shape and file: its entries (`Result`, `Spread`, `Index`), where it lives, the
markers' and numbers' patterns, and reading and writing `bench/results/index.json`."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[2]
INDEX = Path("bench/results/index.json")
RESULTS = Path("bench/results")

# `<!-- r:ID -->` shows an entry's value, `<!-- r:ID:spread -->` its spread.
MARKER_RE = re.compile(r"<!-- r:(?P<id>[\w.-]+)(?::(?P<field>spread))? -->(?P<text>.*?)<!-- /r -->")
TABLE_BEGIN = "<!-- results-index -->"
TABLE_END = "<!-- /results-index -->"
# A result-looking number: a decimal, or a number followed by % or × (not a product such as
# 64×4×128). Integers alone are setup (steps, cores, repeats) and are not asked for.
NUMBER_RE = re.compile(r"(?<![\w.])[+−-]?\d[\d,]*(?:\.\d+)?(?:%|×(?!\d))|(?<![\w.])[+−-]?\d+\.\d+")
FMT_RE = re.compile(r"(?P<plus>\+?)(?P<comma>,?)\.(?P<digits>\d)(?P<kind>[f%])")
MINUS = "−"  # the pages' minus sign (U+2212)
DASH = "–"  # between the ends of a range (U+2013)

Agg = Literal["one", "mean", "mean_abs", "min", "max", "range"]
Number = Decimal


@dataclass(frozen=True)
class Spread:
    """Where an entry's spread comes from. `values`: the lowest and highest of the values at
    `over` (per repeat or per seed). `ratio`: the ratio of two arms' repeats, `over` /
    `under`, from the lowest over the highest to the highest over the lowest: the most the
    repeats allow, pairs of interleaved repeats included."""

    kind: Literal["values", "ratio"]
    over: str
    under: str | None = None


@dataclass(frozen=True)
class Result:
    """One headline number. `key` is a dotted path in `file` (a segment may be `*`, a list
    slice `0:3`, or alternatives `{a,b}`; more than one value needs an `agg`). `shown` is the
    text between the page's markers: the JSON's value times `scale`, formatted by `fmt`
    (`.3f`, `+.3f`, `.1%`, `,.0f`; `range` shows `lo–hi`). `repeats` is the JSON's `repeats`
    where it records one. `caveat` is the bad news that goes with it, and `shown_with` the
    ids of entries that must stand in the same bullet or table row wherever this one does."""

    id: str
    label: str
    script: str
    file: str
    key: str
    fmt: str
    shown: str
    date: str
    machine: str
    repeats: int | None = None
    agg: Agg = "one"
    scale: str = "1"
    spread: str | None = None
    spread_of: Spread | None = None
    caveat: str | None = None
    shown_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Index:
    """The index file: the pages carrying markers, the README sections where every
    result-looking number must be marked, the phrases there whose numbers are setup or
    targets, the files kept although superseded (a doc cites them; no entry may read them),
    and the entries."""

    pages: tuple[str, ...]
    headline_sections: tuple[str, ...]
    setup_phrases: tuple[str, ...]
    superseded: dict[str, str]
    results: tuple[Result, ...]
    readme: str = "README.md"
    by_id: dict[str, Result] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.by_id.update({r.id: r for r in self.results})


# ---- the index file -------------------------------------------------------------------------


def load_index(root: Path = ROOT) -> Index:
    raw = json.loads((root / INDEX).read_text())
    results = []
    for r in raw["results"]:
        spread_of = Spread(**r["spread_of"]) if r.get("spread_of") else None
        results.append(
            Result(**{**r, "spread_of": spread_of, "shown_with": tuple(r.get("shown_with", ()))})
        )
    return Index(
        pages=tuple(raw["pages"]),
        headline_sections=tuple(raw["headline_sections"]),
        setup_phrases=tuple(raw["setup_phrases"]),
        superseded=dict(raw["superseded"]),
        results=tuple(results),
        readme=raw.get("readme", "README.md"),
    )


def dump_index(index: Index) -> str:
    """The index as its file holds it: optional fields left out where unset."""

    def entry(r: Result) -> dict[str, Any]:
        d = asdict(r)
        d["shown_with"] = list(r.shown_with)
        defaults: dict[str, Any] = {"repeats": None, "agg": "one", "scale": "1", "spread": None}
        defaults |= {"spread_of": None, "caveat": None, "shown_with": []}
        return {k: v for k, v in d.items() if not (k in defaults and v == defaults[k])}

    raw = {
        "readme": index.readme,
        "pages": list(index.pages),
        "headline_sections": list(index.headline_sections),
        "setup_phrases": list(index.setup_phrases),
        "superseded": index.superseded,
        "results": [entry(r) for r in index.results],
    }
    return json.dumps(raw, indent=2, ensure_ascii=False) + "\n"
