"""Step accounting when checkpoints are lost to corruption: the training worker restarts,
its newest checkpoint (or every one) fails its digest and is set aside, and the run goes on
from an older one (or the base model) by re-training the lost steps from the store, to the
same versions, weights and consumption records as an uninterrupted run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tasks.accounting import already_stepped
from tasks.worker import store_of
from tests.tasks.conftest import drop_trainers
from tests.tasks.test_training import AGENT, assert_same_run, run_steps


def corrupt(ckpt: Path) -> None:
    state = ckpt / "state.safetensors"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    state.write_bytes(bytes(raw))


@pytest.mark.parametrize("lost", ["newest", "all"])
def test_resume_after_corrupt_checkpoints_retrains_the_lost_steps(
    new_ctx, lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    ref = new_ctx("ref")
    ref_steps = run_steps(ref, 4)
    ctx = new_ctx("corrupt")  # checkpoint every step, keep 2: v000002 and v000003
    first = run_steps(ctx, 3)
    root = Path(ctx.checkpoint_root(AGENT).removeprefix("file://"))
    assert sorted(p.name for p in root.iterdir()) == ["v000002", "v000003"]
    for name in ["v000003"] if lost == "newest" else ["v000002", "v000003"]:
        corrupt(root / name)
    records = {k: store_of(ctx).table(AGENT).consumption(k) for k in range(3)}
    drop_trainers(ctx)  # the worker restarts: what it knew in memory is gone

    with caplog.at_level(logging.WARNING):
        # the steps whose checkpoints are gone are no longer "stepped": they run again
        assert already_stepped(ctx, AGENT, 2) is None
        assert (already_stepped(ctx, AGENT, 1) is None) == (lost == "all")
        again = run_steps(ctx, 4, start=2)
    assert "moved aside to" in caplog.text
    if lost == "all":  # rebuilt from the base model: steps 0 and 1 replayed from the store
        assert "replayed step 0" in caplog.text and "replayed step 1" in caplog.text
    assert not any(s.resumed for s in again)
    assert {k: store_of(ctx).table(AGENT).consumption(k) for k in range(3)} == records
    assert_same_run(ctx, [*first[:2], *again], ref, ref_steps)
    corrupt_dirs = sorted(p.name for p in root.iterdir() if ".corrupt" in p.name)
    assert corrupt_dirs == (["v000003.corrupt"] if lost == "newest" else
                            ["v000002.corrupt", "v000003.corrupt"])  # fmt: skip
