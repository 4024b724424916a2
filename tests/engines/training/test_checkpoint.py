"""Checkpoint/resume reproduces the next update bit-exactly; HF export loads back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.training.checkpoint import (
    export_hf,
    load_checkpoint,
    maybe_checkpoint,
    restore_trainer,
    save_checkpoint,
)
from engines.training.checkpoint_index import (
    committed_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
)
from engines.training.trainer import AgentTrainer, TrainConfig
from tests.engines.training.training_helpers import merge, random_batch


def _train(tr: AgentTrainer, seed: int) -> None:
    mb = merge(random_batch(seed=seed, n=4))
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    assert not tr.step().skipped


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_resume_reproduces_next_step_exactly(tiny_model: str, tmp_path: Path, scheme: str) -> None:
    cfg = TrainConfig(lr=1e-3, aggregation="seq-mean-token-mean", weight_decay=0.01)
    tr = AgentTrainer("solver", tiny_model, cfg)
    _train(tr, 1)
    _train(tr, 2)
    url = f"file://{tmp_path}/ck" if scheme == "file" else f"memory://ck-{id(tr)}"
    save_checkpoint(tr, url)
    _train(tr, 3)
    resumed = restore_trainer(url)
    assert (resumed.version, resumed.agent, resumed.config) == (2, "solver", cfg)
    _train(resumed, 3)
    assert resumed.version == tr.version == 3
    a, b = tr.state(), resumed.state()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_every_k_and_latest(tiny_model: str, tmp_path: Path) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-3))
    root = str(tmp_path / "ckpts")
    assert latest_checkpoint(root) is None
    written = []
    for s in range(5):
        _train(tr, s)
        written.append(maybe_checkpoint(tr, root, every=2))
    assert written == [None, f"{root}/v000002", None, f"{root}/v000004", None]
    assert latest_checkpoint(root) == f"{root}/v000004"
    (tmp_path / "ckpts" / "v000004" / "meta.json").unlink()  # unfinished write: ignored
    assert latest_checkpoint(root) == f"{root}/v000002"
    with pytest.raises(FileNotFoundError, match=r"v000004.*meta\.json"):
        load_checkpoint(f"{root}/v000004")
    with pytest.raises(ValueError, match="interval must be > 0"):
        maybe_checkpoint(tr, root, every=0)


def test_keep_prunes_old_checkpoints_but_never_the_newest(tiny_model: str, tmp_path: Path) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-3))
    root = str(tmp_path / "ckpts")
    (tmp_path / "ckpts" / "v000099").mkdir(parents=True)  # a write cut short: not committed
    for s in range(4):
        _train(tr, s)
        maybe_checkpoint(tr, root, every=1, keep=2)
    assert committed_checkpoints(root) == [f"{root}/v000003", f"{root}/v000004"]
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == [
        "v000003",
        "v000004",
        "v000099",  # left alone: pruning only touches committed checkpoints
    ]
    restored = restore_trainer(latest_checkpoint(root) or "")
    assert restored.version == 4
    assert prune_checkpoints(root, keep=1) == [f"{root}/v000003"]
    with pytest.raises(ValueError, match="checkpoints to keep must be >= 1"):
        maybe_checkpoint(tr, root, every=1, keep=0)


def test_load_state_rejects_foreign_state(tiny_model: str) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig())
    state, meta = tr.state(), tr.meta()
    del state["model/lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        tr.load_state(state, meta)
    with pytest.raises(ValueError, match="state format"):
        tr.load_state(tr.state(), {**meta, "format": 99})


def test_export_hf_loads_with_transformers(tiny_model: str, tmp_path: Path) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-3))
    _train(tr, 7)
    out = export_hf(tr, tmp_path / "hf")
    assert (out / "tokenizer.json").exists() and (out / "config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("w5 w6")["input_ids"] == [5, 6]
    trained = tr.weights()
    for k, v in model.state_dict().items():
        assert torch.equal(v, trained[k]), k
