"""The order in which a step's micro-batches may train: the pipeline's edges between train
tasks and what `tasks.accounting.acquire` re-accumulates after a worker died come from this
one rule. Torch-free: the driver imports it."""

from __future__ import annotations


def parts_before(mb: int) -> int:
    """How many of a step's micro-batches must be accumulated before micro-batch `mb`.

    None before the first two: they train in whichever order their rows arrive, and their
    gradients' sum is the same either way, bit for bit (floating-point addition commutes).
    All earlier ones from the third on: addition does not associate, so a longer sum keeps
    one order. The pipeline gives train tasks these edges; `acquire` re-accumulates exactly
    these after a worker died."""
    return 0 if mb < 2 else mb
