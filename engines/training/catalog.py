"""The training registries' names and flags, answerable without importing torch.

The driver validates a MEG's `loss:` block (unknown advantage? a policy loss that is not exact
under zero-advantage skipping?) before any worker exists, and it must not import torch to do
so: the loss registries live beside their torch math (`advantages.py`, `losses.py`,
`aggregate.py`). So the built-in names are declared here, once, and
`tests/engines/training/test_catalog.py` checks they match what the modules register. A
plug-in that registers its own loss has already imported the registry module (that is how it
registers), so its names are read from the live registry.
"""

from __future__ import annotations

import sys

# `LossSpec` field → (module, registry attribute, built-in names).
REGISTRIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "advantage": (
        "engines.training.advantages",
        "ADVANTAGES",
        ("grpo", "grpo_no_std", "rloo", "reinforce", "maxrl"),
    ),
    "policy_loss": ("engines.training.losses", "POLICY_LOSSES", ("grpo", "dr_grpo")),
    "aggregation": (
        "engines.training.aggregate",
        "AGGREGATIONS",
        ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    ),
    "old_logprobs": (
        "engines.training.losses",
        "ANCHORS",
        ("behaviour", "recompute", "sparse_rl", "external"),
    ),
    "credit": ("engines.training.turn_credit", "CREDITS", ("crbc", "episode", "turn")),
}

# Turn credit rules (`loss.credit`) whose advantage needs every round of a loop in one score
# task (the scoring plan joins them; `turn` scores each round as soon as it exists).
WHOLE_LOOP_CREDITS = frozenset({"episode", "crbc"})

# Built-in policy losses whose loss is 0 for a zero-advantage sequence without a KL term.
ZERO_AT_ZERO_ADVANTAGE = frozenset({"grpo", "dr_grpo"})


def loss_names() -> dict[str, list[str]]:
    """`LossSpec` field → the names its registry knows (for `meg.validate(known_losses=...)`)."""
    names = {}
    for field, (module, attr, builtins) in REGISTRIES.items():
        loaded = sys.modules.get(module)
        names[field] = getattr(loaded, attr).names() if loaded else list(builtins)
    return names


def zero_at_zero_advantage(name: str) -> bool:
    """Whether policy loss `name` is 0 at A = 0 (without KL), so skipping such rows is exact.

    A plug-in declares it with `@register_policy_loss(name, zero_at_zero_advantage=True)`.
    """
    if name in ZERO_AT_ZERO_ADVANTAGE:
        return True
    losses = sys.modules.get("engines.training.losses")
    registry = getattr(losses, "POLICY_LOSSES", None)
    if registry is None or name not in registry:
        return False
    return bool(registry.meta(name).get("zero_at_zero_advantage"))
