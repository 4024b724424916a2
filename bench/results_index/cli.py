"""The command line: `python -m bench.results_index render|check`.

render: values, spreads and dates from each entry's JSON into bench/results/index.json,
then the index into the pages' markers. check: exit 1 with one line per problem (an
unmarked number on the front page, a marker that disagrees with the index, an entry that
disagrees with its JSON, one key with two values among a benchmark's files)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.results_index.checks import problems
from bench.results_index.model import ROOT
from bench.results_index.rendering import render


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.results_index",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["render", "check"])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.command == "render":
        changed, failed = render(args.root)
        for f in changed:
            print(f"rendered {f}")
        for f in failed:
            print(f"not rendered: {f}")
        return 1 if failed else 0
    found = problems(args.root)
    for p in found:
        print(p)
    print(f"{len(found)} problem(s)" if found else "results index: pages, index and JSON agree")
    return 1 if found else 0
