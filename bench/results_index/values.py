"""Values from the benchmarks' JSON: key paths, rounding half up, an entry refreshed from its
file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from bench.results_index.model import DASH, FMT_RE, MINUS, Number, Result


class Missing(Exception):
    """A file or key an entry names is not there."""


def read_json(path: Path) -> Any:
    if not path.exists():
        raise Missing(f"{path.name}: no such file")
    return json.loads(path.read_text(), parse_float=Decimal)


def _children(node: Any, seg: str, where: str) -> Iterator[tuple[str, Any]]:
    if seg == "*":
        items = node.items() if isinstance(node, dict) else enumerate(node)
        yield from ((str(k), v) for k, v in items)
    elif seg.startswith("{") and seg.endswith("}"):
        for alt in seg[1:-1].split(","):
            yield from _children(node, alt, where)
    elif isinstance(node, list):
        if ":" in seg:
            lo, _, hi = seg.partition(":")
            idx = range(len(node))[slice(int(lo) if lo else None, int(hi) if hi else None)]
            yield from ((str(i), node[i]) for i in idx)
        elif re.fullmatch(r"-?\d+", seg) and -len(node) <= int(seg) < len(node):
            yield str(int(seg) % len(node)), node[int(seg)]
        else:
            raise Missing(f"{where}: no item {seg!r}")
    elif isinstance(node, dict) and seg in node:
        yield seg, node[seg]
    else:
        raise Missing(f"{where}: no key {seg!r}")


def lookup(data: Any, path: str) -> list[tuple[str, Number]]:
    """(concrete path, value) of every number at `path` in `data`."""
    nodes: list[tuple[str, Any]] = [("", data)]
    for seg in path.split("."):
        nodes = [
            (f"{p}.{k}" if p else k, child)
            for p, node in nodes
            for k, child in _children(node, seg, p or "the top level")
        ]
    leaves: list[tuple[str, Any]] = []
    for p, v in nodes:  # a path ending at a list (per-repeat values) means its items
        leaves += [(f"{p}.{i}", x) for i, x in enumerate(v)] if isinstance(v, list) else [(p, v)]
    out = []
    for p, v in leaves:
        if isinstance(v, bool) or not isinstance(v, int | Decimal):
            raise Missing(f"{p}: {v!r} is not a number")
        out.append((p, Decimal(v)))
    if not out:
        raise Missing(f"{path}: no values")
    return out


def fmt_number(value: Number, fmt: str, scale: str = "1") -> str:
    """`value × scale` rounded half up as `fmt` says, with the pages' minus sign."""
    m = FMT_RE.fullmatch(fmt)
    if m is None:
        raise ValueError(f"format {fmt!r}: not one of .Nf, +.Nf, ,.Nf, .N%, +.N%")
    v = value * Decimal(scale) * (100 if m["kind"] == "%" else 1)
    q = v.quantize(Decimal(1).scaleb(-int(m["digits"])), rounding=ROUND_HALF_UP)
    text = format(abs(q), f"{m['comma']}.{m['digits']}f")
    sign = MINUS if q < 0 else "+" if m["plus"] and q > 0 else ""
    return sign + text + ("%" if m["kind"] == "%" else "")


def fmt_range(lo: Number, hi: Number, fmt: str, scale: str = "1") -> str:
    a, b = fmt_number(lo, fmt, scale), fmt_number(hi, fmt, scale)
    return a if a == b else f"{a}{DASH}{b}"


def shown_value(r: Result, data: Any) -> str:
    values = [v for _, v in lookup(data, r.key)]
    if r.agg == "one":
        if len(values) != 1:
            raise Missing(f"{r.key}: {len(values)} values; say how to combine them (agg)")
        return fmt_number(values[0], r.fmt, r.scale)
    if r.agg == "range":
        return fmt_range(min(values), max(values), r.fmt, r.scale)
    n = Decimal(len(values))
    if r.agg == "mean":
        value = sum(values, Decimal(0)) / n
    elif r.agg == "mean_abs":
        value = sum((abs(v) for v in values), Decimal(0)) / n
    else:
        value = min(values) if r.agg == "min" else max(values)
    return fmt_number(value, r.fmt, r.scale)


def spread_value(r: Result, data: Any) -> str | None:
    s = r.spread_of
    if s is None:
        return None
    over = [v for _, v in lookup(data, s.over)]
    if s.kind == "values":
        return fmt_range(min(over), max(over), r.fmt, r.scale)
    if s.under is None:
        raise Missing(f"spread of {r.id}: a ratio needs `under`")
    under = [v for _, v in lookup(data, s.under)]
    return fmt_range(min(over) / max(under), max(over) / min(under), r.fmt, r.scale)


def vendor(text: str) -> str | None:
    """The processor's vendor named in a machine description (the VM behind one name
    changed between sessions: a ratio measured on the AMD VM is not the Intel VM's)."""
    for name in ("Intel", "AMD"):
        if name.lower() in text.lower():
            return name
    return None


def refreshed(r: Result, data: Any) -> Result:
    """`r` with what the JSON says: the value as shown, the spread, date and repeats."""
    return replace(
        r,
        shown=shown_value(r, data),
        spread=spread_value(r, data) if r.spread_of else r.spread,
        date=str(data.get("date", r.date)),
        repeats=int(data["repeats"]) if "repeats" in data else r.repeats,
    )


def marker_text(r: Result, spread: bool) -> str | None:
    """What a marker of `r` shows: its value, or its spread (None: it has none)."""
    return r.spread if spread else r.shown
