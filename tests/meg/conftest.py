from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.meg.agentic_graphs import LOOP, PLAIN

BASE: dict[str, Any] = {
    "name": "t",
    "agents": {"a": {"model": "hf://org/model"}, "b": {"model": "hf://org/model"}},
    "nodes": {
        "x": {"agent": "a", "template": "Q: {question}", "n": 2},
        "y": {"agent": "b", "template": "{x} ok?", "n": 2, "inputs": {"x": "per_sample"}},
    },
    "rewards": {"x": {"fn": "exact_answer"}},
}


@pytest.fixture
def base() -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(BASE))  # deep copy


@pytest.fixture
def loop() -> dict[str, Any]:
    """A copy of `agentic_graphs.LOOP`: two rounds of act -> check (tool) -> judge."""
    return yaml.safe_load(yaml.safe_dump(LOOP))


@pytest.fixture
def plain() -> dict[str, Any]:
    """A copy of `agentic_graphs.PLAIN`: a plain graph with a top-level tool node."""
    return yaml.safe_load(yaml.safe_dump(PLAIN))
