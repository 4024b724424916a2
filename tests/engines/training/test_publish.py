"""Weight publication: key layout, discovery from a second store handle, retention GC."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.training.publish import (
    gc_published,
    latest_published,
    publish_weights,
    published_versions,
    weights_key,
)
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import StateStore, Url


def test_publish_discover_and_gc(tiny_model: str, tmp_path: Path) -> None:
    root = f"file://{tmp_path}/states"
    store = StateStore(root)
    tr = AgentTrainer("solver", tiny_model, TrainConfig())
    assert latest_published(store, "solver") is None
    for v in range(4):
        ref = publish_weights(store, "solver", v, tr.weights(), retain=2)
        assert ref.key == weights_key("solver", v) == f"weights/solver/v{v:06d}"
        assert ref.location == Url(root)
    publish_weights(store, "verifier", 0, {"w": torch.ones(2)})
    reader = StateStore(root)  # a rollout host in another process: no shared handle
    assert published_versions(reader, "solver") == [2, 3]
    assert latest_published(reader, "solver") == 3
    assert latest_published(reader, "verifier") == 0
    tensors, meta = reader.get(weights_key("solver", 3))
    assert meta == {"agent": "solver", "version": 3}
    for name, w in tr.weights().items():
        assert torch.equal(tensors[name], w), name
    assert gc_published(store, "solver", retain=1) == [2]
    assert published_versions(StateStore(root), "solver") == [3]
    with pytest.raises(ValueError, match="retain must be >= 1"):
        gc_published(store, "solver", retain=0)
    with pytest.raises(ValueError, match="version must be >= 0"):
        weights_key("solver", -1)
