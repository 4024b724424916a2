"""The engine-churn benchmark: its arithmetic, and a small real run that keeps it working
(both arms in their own processes, the keys; the memory figures are measured, not asserted)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.engine_churn import ARMS, main, per_engine

pytestmark = pytest.mark.slow


def test_growth_per_engine_is_counted_after_the_warm_engines() -> None:
    # engine 1 fills one-time caches; from engine 2 on: 10 MiB an engine
    assert per_engine([100.0, 150.0, 160.0, 170.0]) == 10.0
    assert per_engine([100.0, 150.0, 149.0]) == -1.0  # a process may give memory back


def test_engine_churn_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    res = main(["--small", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert res["engines"] == 3 and res["tokenizer_vocab"] == 20_000
    for arm in ARMS:
        rss = res["rss_mib"][arm]
        assert len(rss) == 3 and all(math.isfinite(v) and v > 0 for v in rss)
        assert res[f"rss_mib_per_engine_{arm}"] == per_engine(rss)
