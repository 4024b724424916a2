"""Checkpoint digests: a sha256 per file in meta.json, checked on load; a damaged newest
checkpoint is set aside (renamed, never deleted) with a warning and the previous one used;
checkpoints from before digests still load, with a note."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engines.training.checkpoint import (
    load_checkpoint,
    maybe_checkpoint,
    restore_latest,
    restore_trainer,
    save_checkpoint,
)
from engines.training.checkpoint_files import CorruptCheckpointError
from engines.training.checkpoint_index import latest_checkpoint
from engines.training.trainer import AgentTrainer, TrainConfig
from tests.engines.training.training_helpers import merge, random_batch

LOG = "engines.training.checkpoint"


def _train(tr: AgentTrainer, seed: int) -> None:
    mb = merge(random_batch(seed=seed, n=4))
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    assert not tr.step().skipped


@pytest.fixture
def three(tiny_model: str, tmp_path: Path) -> tuple[Path, AgentTrainer]:
    """Checkpoints v000001..v000003 of one trainer under `<tmp>/ck`."""
    tr = AgentTrainer("solver", tiny_model, TrainConfig(lr=1e-3))
    for s in range(3):
        _train(tr, s)
        maybe_checkpoint(tr, str(tmp_path / "ck"), every=1)
    return tmp_path / "ck", tr


def test_save_records_a_sha256_per_file_and_load_hides_it(three: tuple[Path, AgentTrainer]) -> None:
    root, tr = three
    doc = json.loads((root / "v000003/meta.json").read_text())
    state = (root / "v000003/state.safetensors").read_bytes()
    assert doc["digest"]["algorithm"] == "sha256"
    assert doc["digest"]["files"] == {"state.safetensors": hashlib.sha256(state).hexdigest()}
    tensors, meta = load_checkpoint(f"{root}/v000003")
    assert "digest" not in meta and meta["version"] == 3
    assert all(torch.equal(v, tr.state()[k]) for k, v in tensors.items())
    assert sorted(p.name for p in root.iterdir()) == ["v000001", "v000002", "v000003"]  # no temp


def flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # deep in the tensor data: safetensors itself would not notice
    path.write_bytes(bytes(raw))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def bump_version(path: Path) -> None:
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "version": 4}, indent=1, sort_keys=True))


def garbage(path: Path) -> None:
    path.write_bytes(b"\x00not json")


DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "flipped-byte": ("state.safetensors", flip, "state.safetensors does not match"),
    "truncated": ("state.safetensors", truncate, "state.safetensors does not match"),
    "deleted-state": ("state.safetensors", Path.unlink, "state.safetensors is missing"),
    "meta-field-edited": ("meta.json", bump_version, "meta.json does not match its own"),
    "meta-not-json": ("meta.json", garbage, "meta.json is not JSON"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_used(
    three: tuple[Path, AgentTrainer], damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = three
    name, hurt, says = DAMAGE[damage]
    hurt(root / "v000003" / name)
    kept = {p.name: p.read_bytes() for p in (root / "v000003").iterdir()}
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {root}/v000003: {says}"):
        load_checkpoint(f"{root}/v000003")
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert latest_checkpoint(str(root)) == f"{root}/v000002"
    assert f"moved aside to {root}/v000003.corrupt (not deleted)" in caplog.text
    assert sorted(p.name for p in root.iterdir()) == ["v000001", "v000002", "v000003.corrupt"]
    assert {p.name: p.read_bytes() for p in (root / "v000003.corrupt").iterdir()} == kept
    restored = restore_latest(str(root))
    assert restored is not None and restored.version == 2


def test_restore_latest_sets_aside_what_it_finds_corrupt_on_load(
    three: tuple[Path, AgentTrainer], caplog: pytest.LogCaptureFixture
) -> None:
    """latest_checkpoint verified v000003 earlier in this process; the file changes after:
    the load (which always hashes) catches it, and a later corruption is set aside too."""
    root, _ = three
    assert latest_checkpoint(str(root)) == f"{root}/v000003"
    flip(root / "v000003/state.safetensors")
    with caplog.at_level(logging.WARNING, logger=LOG):
        restored = restore_latest(str(root))
    assert restored is not None and restored.version == 2
    assert "v000003.corrupt" in caplog.text and latest_checkpoint(str(root)) == f"{root}/v000002"
    truncate(root / "v000002/state.safetensors")  # the same again: the name .corrupt is free
    assert latest_checkpoint(str(root)) == f"{root}/v000001"
    assert sorted(p.name for p in root.iterdir()) == [
        "v000001",
        "v000002.corrupt",
        "v000003.corrupt",
    ]


def test_a_second_corruption_of_one_version_gets_its_own_name(
    three: tuple[Path, AgentTrainer],
) -> None:
    root, tr = three
    flip(root / "v000003/state.safetensors")
    assert latest_checkpoint(str(root)) == f"{root}/v000002"
    save_checkpoint(tr, f"{root}/v000003")  # the step runs again and rewrites v000003
    assert latest_checkpoint(str(root)) == f"{root}/v000003"
    flip(root / "v000003/state.safetensors")
    assert latest_checkpoint(str(root)) == f"{root}/v000002"
    assert {p.name for p in root.iterdir()} >= {"v000003.corrupt", "v000003.corrupt.2"}


def test_deleted_meta_means_not_committed(
    three: tuple[Path, AgentTrainer], caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = three
    (root / "v000003/meta.json").unlink()
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert latest_checkpoint(str(root)) == f"{root}/v000002"
        assert latest_checkpoint(str(root)) == f"{root}/v000002"
    assert caplog.text.count("v000003 has no meta.json") == 1  # noted once, left in place
    assert (root / "v000003/state.safetensors").exists()
    with pytest.raises(FileNotFoundError, match=r"v000003.*has no meta\.json"):
        load_checkpoint(f"{root}/v000003")


def test_checkpoint_without_a_digest_still_loads_with_a_note(
    three: tuple[Path, AgentTrainer], caplog: pytest.LogCaptureFixture
) -> None:
    root, tr = three
    meta = root / "v000003/meta.json"
    doc = json.loads(meta.read_text())
    del doc["digest"]  # as written by FlexMARL before digests
    meta.write_text(json.dumps(doc, indent=1, sort_keys=True))
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert latest_checkpoint(str(root)) == f"{root}/v000003"
        restored = restore_trainer(f"{root}/v000003")
    assert "v000003 has no digest" in caplog.text and "loaded unverified" in caplog.text
    assert restored.version == 3
    assert all(torch.equal(v, tr.state()[k]) for k, v in restored.state().items())
    truncate(root / "v000003/state.safetensors")  # undetectable until parsed: still clear
    with pytest.raises(CorruptCheckpointError, match=r"state\.safetensors cannot be read"):
        load_checkpoint(f"{root}/v000003")
    assert restore_latest(str(root)).version == 2  # type: ignore[union-attr]
