"""The small agentic graphs the loop and tool-node tests load (`loop`, `plain` in
`conftest.py` hand out copies), and how they load them."""

from __future__ import annotations

from typing import Any

import pytest

from meg import MEGError, MEGSpec, build_spec, validate
from workloads.tools import known_tools

KNOWN = ("exact_answer", "verdict")

# one round: act (agent a) -> check (tool) -> judge (agent b); a later round re-enters at act
LOOP: dict[str, Any] = {
    "name": "t",
    "agents": {"a": {"model": "hf://org/model"}, "b": {"model": "hf://org/model"}},
    "loops": {
        "fix": {
            "rounds": 2,
            "body": {
                "act": {"agent": "a", "template": "Q: {question}", "n": 2},
                "check": {"tool": {"fn": "calculator"}, "inputs": {"act": "per_sample"}},
                "judge": {
                    "agent": "b",
                    "template": "{act} {check} ok?",
                    "inputs": {"check": "per_sample", "act": "first"},
                },
            },
            "again": {
                "act": {
                    "template": "{act} {check} {judge} again:",
                    "n": 1,
                    "inputs": {"judge": "per_sample", "act": "first", "check": "first"},
                }
            },
            "until": [{"node": "judge", "params": {"text": "yes"}}],
        }
    },
    "rewards": {"act": {"fn": "exact_answer"}},
}

# a plain graph with a top-level tool node
PLAIN: dict[str, Any] = {
    "name": "t",
    "agents": {"a": {"model": "hf://org/model"}, "b": {"model": "hf://org/model"}},
    "nodes": {
        "x": {"agent": "a", "template": "Q: {question}", "n": 2},
        "t": {"tool": {"fn": "calculator"}, "inputs": {"x": "per_sample"}},
        "y": {"agent": "b", "template": "{x}{t} ok?", "inputs": {"t": "per_sample", "x": "first"}},
    },
    "rewards": {"x": {"fn": "exact_answer"}},
}


def load(data: dict[str, Any], **kw: Any) -> MEGSpec:
    kw.setdefault("known_rewards", KNOWN)
    kw.setdefault("known_tools", known_tools())
    return validate(build_spec(data), check_models=False, **kw)


def refused(data: dict[str, Any], **kw: Any) -> MEGError:
    with pytest.raises(MEGError) as ei:
        load(data, **kw)
    return ei.value
