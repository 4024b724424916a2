"""The store benchmark's --small run: keys and sizes. Its headline ratios (writes 2.62x,
reads 1.80x plain Zarr at full size) are throughput ratios of 4 segments of ~11 KB here,
milliseconds of wall clock on a shared machine, and the benchmark reports no count or byte
they come from (both sides write the same bytes in the same number of arrays): their
direction is not asserted at this size."""

from __future__ import annotations

import json
from pathlib import Path

from bench.store import main


def test_small_store_benchmark_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    main(["--small", "--json", str(out), "--dir", str(tmp_path / "w")])
    result = json.loads(out.read_text())
    for key in (
        "write_ratio_vs_raw_zarr",
        "read_ratio_vs_raw_zarr",
        "commit_ms_p50",
        "write_ratio_vs_npy",
        "read_ratio_vs_npy",
        "marker_ms_p50",
    ):
        assert result[key] > 0, key
    assert result["segments"] == 4 and result["small"] is True
