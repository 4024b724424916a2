"""The frozen reference policy of the KL term."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from engines.training.train_config import DTYPES

_REFERENCE: dict[tuple[str, str, str], torch.nn.Module] = {}


def reference_model(model_path: str, dtype: str, device: str) -> torch.nn.Module:
    """The frozen initial policy for the KL term: one copy per (model, dtype, device) in this
    process, shared by every agent that starts from that model (it never changes, so it is
    not part of any agent's swapped state)."""
    key = (model_path, dtype, str(torch.device(device)))
    if key not in _REFERENCE:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
        model.to(torch.device(device)).eval()  # type: ignore[arg-type]
        model.requires_grad_(False)
        _REFERENCE[key] = model
    return _REFERENCE[key]
