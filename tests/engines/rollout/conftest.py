"""Shared fixtures: one tiny model per session, one loaded backend per name per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.rollout.base import RolloutBackend, make_backend
from workloads.tiny_model import build_tiny_model

BACKENDS = ("hf", "vllm")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer, different weights (seed 1): a 'newer policy'."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_b") / "model", seed=1)


_LOADED: dict[str, RolloutBackend] = {}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tiny_model_dir: Path) -> RolloutBackend:
    """A shared, read-only backend (tests that update weights build their own)."""
    name = request.param
    if name not in _LOADED:
        _LOADED[name] = make_backend(name, tiny_model_dir)
    return _LOADED[name]
