"""The pending step's bookkeeping: which micro-batches it holds and their counts, and the
constant an aggregation mode divides the summed gradients by once the batch is known."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from engines.training.aggregate import aggregate


def normaliser(mode: str, tokens: int, seqs: int) -> float:
    """The constant an aggregation mode divides by, for a batch of `tokens`/`seqs`.

    Every mode is Σ(per-sequence term)/c; aggregating a unit loss with normalisers 1 and with
    the real counts gives c as their ratio, so no mode needs a second table of constants."""
    one = torch.ones(1, 1)
    unit = float(aggregate(one, one, mode, global_tokens=1, global_seqs=1))
    real = float(aggregate(one, one, mode, global_tokens=max(tokens, 1), global_seqs=max(seqs, 1)))
    return unit / real


@dataclass(slots=True)
class Accum:
    """Counts, loss and parts of the pending step; JSON-able, so it travels with the state."""

    global_tokens: int | None
    global_seqs: int | None
    step: int | None = None
    loss: float = 0.0
    finite: bool = True
    tokens: int = 0
    seqs: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    parts: dict[int, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["parts"] = [[j, t, s] for j, (t, s) in sorted(self.parts.items())]  # int keys
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Accum:
        parts = {int(j): (int(t), int(s)) for j, t, s in data.get("parts", [])}
        return cls(**{**data, "parts": parts})
