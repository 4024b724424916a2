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
