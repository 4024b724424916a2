"""bench/gpu.py runs its whole code path on a CPU (`--device cpu`): every key written, the
CUDA-only ones null, and the one target that is a CPU number met: a bf16 step at lr 1e-6
moves every weight with a gradient. The rest are timings (`swap_ratio_vs_plain` compares
copies of a few milliseconds here; tok/s of 8 prompts): reported, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import main

pytestmark = pytest.mark.slow


def test_a_small_cpu_run_writes_every_key(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    res = main(
        ["--device", "cpu", "--shape", "tiny", "--prompts", "8", "--new-tokens", "16",
         "--train-seqs", "8", "--train-len", "32", "--swap-rounds", "3", "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == res
    assert res["bf16_update_fraction"] >= 0.99  # before float32 masters: 0.021 at this lr
    assert res["hf_device"] == "cpu" and res["hf_uses_worker_gpu"] is None
    assert res["train_mfu_bf16"] is None  # CUDA only
    for key in ("hf_decode_tok_s", "train_tok_s", "swap_out_s", "swap_in_s", "plain_out_s"):
        assert res[key] > 0, key
    assert res["swap_state_gb"] > 0 and res["swap_ratio_vs_plain"] > 0


def test_fewer_than_three_swap_rounds_are_refused() -> None:
    with pytest.raises(SystemExit, match="swap-rounds"):
        main(["--device", "cpu", "--swap-rounds", "2"])
