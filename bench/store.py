"""Benchmark: MEG Store segments vs raw Zarr arrays vs numpy .npy files, same bytes, one run.

    python -m bench.store [--small] [--json PATH] [--dir DIR]

Writes N realistic segments (64 samples × 256 prompt + 512 response tokens with logprobs by
default) through ``Table.write_segment``, then the same arrays (the store's packed layout,
``storage.segments.pack``: same bytes, same array count) with plain zarr (one synchronous
``create_array`` per array, default codecs) and with ``np.save``; reads all three back.
Ratios are ours / baseline throughput (higher is better). ``commit_ms_p50`` is the median
latency of ``write_segment`` from call to visible-to-readers; ``marker_ms_p50`` the commit
point alone (building + exclusively putting the marker).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from rich.console import Console
from rich.table import Table as RichTable

from storage.schema import SampleBatch, SegmentKey
from storage.segments import ROWS_LAYOUT, pack
from storage.store import MEGStore
from storage.testing import synthetic_batch


def _batches(n: int, groups: int, group_size: int, p_len: int, r_len: int) -> list[SampleBatch]:
    return [
        synthetic_batch(
            SegmentKey(0, j, "solve"),
            groups=groups,
            group_size=group_size,
            prompt_len=p_len,
            response_len=r_len,
            ragged=False,
            seed=j,
        )
        for j in range(n)
    ]


def _nbytes(b: SampleBatch) -> int:
    return sum(c.nbytes for c in b.columns().values())


def _timed(fn: Callable[[int], Any], n: int) -> list[float]:
    out = []
    for j in range(n):
        t = time.perf_counter()
        fn(j)
        out.append(time.perf_counter() - t)
    return out


def run(small: bool, workdir: Path) -> dict[str, Any]:
    n, groups, gsize, p_len, r_len = (4, 2, 4, 32, 64) if small else (40, 8, 8, 256, 512)
    batches = _batches(n, groups, gsize, p_len, r_len)
    total = sum(_nbytes(b) for b in batches)
    store = MEGStore.open(str(workdir / "meg"), "bench")
    table = store.table("solver")
    markers: list[float] = []

    def ours_write(j: int) -> None:
        table.write_segment(SegmentKey(0, j, "solve"), batches[j])
        markers.append(table.last_marker_s)

    raw_root = workdir / "raw"
    # the baselines get the arrays ready-made (packing is ours to pay for, not theirs)
    packed = [pack(b.columns(), ROWS_LAYOUT) for b in batches]

    def raw_write(j: int) -> None:
        g = zarr.open_group(str(raw_root / f"seg{j}"), mode="w")
        for name, col in packed[j].items():
            a = g.create_array(
                name,
                shape=col.shape,
                dtype=str if col.dtype.kind == "U" else col.dtype,
                chunks=col.shape,
            )
            a[...] = col

    def npy_write(j: int) -> None:
        d = workdir / "npy" / f"seg{j}"
        d.mkdir(parents=True, exist_ok=True)
        for name, col in packed[j].items():
            np.save(d / f"{name}.npy", col)

    fresh = MEGStore.open(str(workdir / "meg"), "bench", create=False).table("solver")
    names = list(ROWS_LAYOUT)

    def ours_read(j: int) -> None:
        fresh.read(segments=[SegmentKey(0, j, "solve").id])

    def raw_read(j: int) -> None:
        g = zarr.open_group(str(raw_root / f"seg{j}"), mode="r")
        for name in names:
            g[name][...]  # type: ignore[index]

    def npy_read(j: int) -> None:
        for name in names:
            np.load(workdir / "npy" / f"seg{j}" / f"{name}.npy")

    # interleave warm-up runs so no backend gets a cold-start penalty alone
    for fn in (raw_write, npy_write):
        fn(0)
    shutil.rmtree(raw_root)
    shutil.rmtree(workdir / "npy")
    w = {
        "ours": _timed(ours_write, n),
        "raw_zarr": _timed(raw_write, n),
        "npy": _timed(npy_write, n),
    }
    r = {"ours": _timed(ours_read, n), "raw_zarr": _timed(raw_read, n), "npy": _timed(npy_read, n)}
    mbps = {
        f"{k}_{op}_MBps": total / sum(v) / 1e6
        for op, d in (("write", w), ("read", r))
        for k, v in d.items()
    }
    return {
        "write_ratio_vs_raw_zarr": sum(w["raw_zarr"]) / sum(w["ours"]),
        "read_ratio_vs_raw_zarr": sum(r["raw_zarr"]) / sum(r["ours"]),
        "write_ratio_vs_npy": sum(w["npy"]) / sum(w["ours"]),
        "read_ratio_vs_npy": sum(r["npy"]) / sum(r["ours"]),
        "commit_ms_p50": statistics.median(w["ours"]) * 1e3,
        "marker_ms_p50": statistics.median(markers) * 1e3,
        "raw_zarr_segment_ms_p50": statistics.median(w["raw_zarr"]) * 1e3,
        "npy_segment_ms_p50": statistics.median(w["npy"]) * 1e3,
        **mbps,
        "segments": n,
        "rows_per_segment": groups * gsize,
        "tokens_per_row": p_len + r_len,
        "bytes_per_segment": total // n,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "date": date.today().isoformat(),
        "small": small,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--dir", type=Path, help="work folder (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    tmp = args.dir or Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        result = run(args.small, tmp)
    finally:
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    t = RichTable(title="MEG Store vs raw Zarr vs .npy (local disk)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in result.items():
        t.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    Console().print(t)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
