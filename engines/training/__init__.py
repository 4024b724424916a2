"""Training engine: pure loss math behind registries, the per-agent trainer, slots, weights."""

from __future__ import annotations


def loss_names() -> dict[str, list[str]]:
    """`LossSpec` field → the names its registry knows (for `meg.validate(known_losses=...)`)."""
    from engines.training.advantages import ADVANTAGES
    from engines.training.aggregate import AGGREGATIONS
    from engines.training.losses import ANCHORS, POLICY_LOSSES

    return {
        "advantage": ADVANTAGES.names(),
        "policy_loss": POLICY_LOSSES.names(),
        "aggregation": AGGREGATIONS.names(),
        "old_logprobs": ANCHORS.names(),
    }
