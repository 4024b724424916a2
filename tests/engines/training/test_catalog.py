"""The torch-free catalog names exactly what the loss registries register."""

from __future__ import annotations

import importlib

import pytest

from engines.training.catalog import REGISTRIES, ZERO_AT_ZERO_ADVANTAGE, zero_at_zero_advantage


@pytest.mark.parametrize("field", sorted(REGISTRIES))
def test_builtin_names_match_the_registry(field: str) -> None:
    module, attr, builtins = REGISTRIES[field]
    registry = getattr(importlib.import_module(module), attr)
    # Plug-ins loaded by other tests may add names; the built-ins must all be there, and
    # every name the module registered itself must be declared.
    registered_here = {name for name in registry.names() if registry.get(name).__module__ == module}
    assert registered_here == set(builtins)


def test_zero_at_zero_advantage_flags_match() -> None:
    from engines.training.losses import POLICY_LOSSES

    flagged = {
        name
        for name in REGISTRIES["policy_loss"][2]
        if POLICY_LOSSES.meta(name).get("zero_at_zero_advantage")
    }
    assert flagged == ZERO_AT_ZERO_ADVANTAGE


def test_a_plugin_loss_flag_is_read_from_the_live_registry() -> None:
    from engines.training.losses import POLICY_LOSSES, register_policy_loss

    name = "catalog-test-exact"
    if name not in POLICY_LOSSES:
        register_policy_loss(name, zero_at_zero_advantage=True)(lambda *a, **k: None)
    assert zero_at_zero_advantage(name)
    assert not zero_at_zero_advantage("no-such-loss")
