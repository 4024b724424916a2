"""A real run with `run.tracking: [tensorboard, wandb]`: TensorBoard's scalars read back
with TensorBoard's reader, the wandb offline run's records parsed back with wandb's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from tests.flows.conftest import write_config

pytestmark = pytest.mark.slow


def wandb_records(run_dir: Path) -> dict[str, list[Any]]:
    """The records of the run's offline wandb file, by type (history, config, artifact...).

    wandb 0.30 dropped its Python reader (its core is Go now), so the file is read here: a
    7-byte header (":W&B", magic, version), then LevelDB-log records in 32 KiB blocks — a
    7-byte record header (CRC, little-endian length, type FULL/FIRST/MIDDLE/LAST) and its
    piece of one protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    [path] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pieces, out = 7, 32768, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pieces)
            out.setdefault(rec.WhichOneof("record_type"), []).append(rec)
            pieces = b""
    return out


def item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def test_a_tracked_run_logs_every_step_and_agent(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=3, episodes_per_step=4)
    data = yaml.safe_load(cfg.read_text())
    data["run"]["tracking"] = ["tensorboard", "wandb"]
    cfg.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    out = train(
        TrainParams(config=str(cfg), run_dir=str(run_dir), cluster=ClusterConfig(scheduler=cluster))
    )

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for agent in ("solver", "verifier"):
        for name in ("reward", "loss", "grad_norm", "entropy_mc", "tokens_per_s", "staleness"):
            points = events.Scalars(f"{agent}/{name}")
            assert [p.step for p in points] == [0, 1, 2], (agent, name)
    rewards = [p.value for p in events.Scalars("team/reward")]
    assert rewards == pytest.approx([r["team_reward"] for r in out["per_step"]], abs=1e-4)
    assert [p.value for p in events.Scalars("solver/staleness")] == [0, 0, 0]  # flex
    assert "final/solver/text_summary" in events.Tags()["tensors"]

    records = wandb_records(run_dir)
    history = [{item_key(i): i.value_json for i in r.history.item} for r in records["history"]]
    assert [h["_step"] for h in history] == ["0", "1", "2"]
    assert all("solver/reward" in h and "verifier/loss" in h for h in history)
    config = {i.key for r in records["config"] for i in r.config.update}
    assert {"meg.run.mode", "sources.steps", "cluster.train_workers"} <= config
    artifacts = {r.artifact.name for r in records.get("artifact", [])}
    assert {"solver-final", "verifier-final"} <= artifacts
