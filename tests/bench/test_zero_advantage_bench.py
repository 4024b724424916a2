"""A small run of the zero-advantage benchmark keeps it working (keys, the zeroed fractions;
never timings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from bench.zero_advantage import main, zeroed
from engines.training.batch import build_microbatch


def test_zeroed_spreads_whole_groups() -> None:
    mb = build_microbatch([[3]] * 16, [[4, 5]] * 16, [[-1.0, -1.0]] * 16, [1.0] * 16, pad_id=0)
    adv = zeroed(mb, 0.5).advantages.view(4, 4)  # 4 groups of 4
    assert torch.equal((adv == 0).all(1), torch.tensor([False, True, False, True]))
    assert not (zeroed(mb, 0.0).advantages == 0).any()


def test_small_run_writes_every_key(tmp_path: Path) -> None:
    out = tmp_path / "za.json"
    res = main(["--small", "--fractions", "0,0.5", "--threads", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    # `fraction` is counted from the advantages the bench built: half the rows at 0.5, the
    # forward and backward the skip drops (`ideal` 0.5), where skip_train_time_ratio's gain
    # comes from; the ratio itself (0.52 at full size) times steps of 8 sequences of 24
    # tokens here, too short to hold a direction on a shared machine: not asserted
    assert [r["fraction"] for r in res["fractions"]] == [0.0, 0.5]
    for r in res["fractions"]:
        assert r["off_s"] > 0 and r["on_s"] > 0 and r["ideal"] == 1 - r["fraction"]
    assert math.isfinite(res["skip_train_time_ratio"])
