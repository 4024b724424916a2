"""Weight units: which agents share one resident base (LoRA on the same model)."""

from __future__ import annotations

from typing import Any

from meg import build_spec
from meg.sharing import trained_agents, unit_of, weight_units


def _spec(agents: dict[str, dict[str, Any]]) -> Any:
    nodes = {f"n{a}": {"agent": a, "template": "Q: {question}"} for a in agents if a != "idle"}
    return build_spec({"name": "t", "agents": agents, "nodes": nodes})


def test_lora_agents_on_one_model_backend_and_dtype_share_a_unit() -> None:
    spec = _spec(
        {
            "b": {"model": "m", "lora": True},
            "full": {"model": "m"},
            "a": {"model": "m", "lora": {"r": 16}},  # another rank still shares the base
            "bf16": {"model": "m", "lora": True, "dtype": "bfloat16"},
            "hf": {"model": "m", "lora": True, "backend": "hf"},
            "other": {"model": "n", "lora": True},
            "idle": {"model": "m", "lora": True},  # no node: not trained, in no unit
        }
    )
    units = weight_units(spec)
    assert [(u.name, u.agents, u.lora, u.shared) for u in units] == [
        ("b+a", ("b", "a"), True, True),
        ("full", ("full",), False, False),
        ("bf16", ("bf16",), True, False),
        ("hf", ("hf",), True, False),
        ("other", ("other",), True, False),
    ]
    assert trained_agents(spec) == ["b", "full", "a", "bf16", "hf", "other"]
    assert unit_of(spec)["a"] == unit_of(spec)["b"] == "b+a"


def test_unit_names_follow_the_spec_whatever_the_order_asked() -> None:
    spec = _spec({"x": {"model": "m", "lora": True}, "y": {"model": "m", "lora": True}})
    assert [u.name for u in weight_units(spec, ["y", "x"])] == ["x+y"]
    assert [u.name for u in weight_units(spec, ["y"])] == ["y"]  # only the agents asked for
