"""Many small JSON dumps as one file: a folder of a benchmark's per-run files (`name.json`
→ its content) packed into one JSON object, so that git holds one current file per result
instead of a hundred, and readers take either form.

    python -m bench.packed bench/results/e2e_runs bench/results/e2e_runs.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def pack(folder: Path, out: Path) -> Path:
    """Every `*.json` of `folder` into `out` as {file name: its JSON}, names sorted."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.json files to pack")
    data = {f.name: json.loads(f.read_text()) for f in files}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    tmp.replace(out)  # a reader never sees half a file
    return out


def members(source: Path) -> dict[str, Any]:
    """{file name: JSON} of a folder of `*.json` files or of a file `pack` wrote."""
    if source.is_dir():
        return {f.name: json.loads(f.read_text()) for f in sorted(source.glob("*.json"))}
    if source.is_file():
        data = json.loads(source.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{source}: not a packed file (a JSON object of file names)")
        return data
    raise FileNotFoundError(f"{source}: neither a folder of runs nor a packed file")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m bench.packed FOLDER OUT.json")
    print(f"packed {pack(Path(sys.argv[1]), Path(sys.argv[2]))}")
