"""A LoRA adapter directory in PEFT's layout, shared by the trainer and the rollout engines.

`adapter_config.json` + `adapter_model.safetensors`, tensors named as PEFT saves them
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`): what
`peft.PeftModel.from_pretrained(base, dir)` and vLLM's `LoRARequest(name, id, dir)` read.
Safetensors and JSON only; the weights are written first, the config last.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import Tensor

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def write_adapter(out_dir: str | Path, tensors: dict[str, Tensor], config: dict[str, Any]) -> Path:
    """Write a PEFT adapter directory (weights first, the config last)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, out / ADAPTER_WEIGHTS)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1, sort_keys=True))
    return out


def is_adapter_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and (p / ADAPTER_WEIGHTS).is_file()


def read_adapter(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(tensors with PEFT's saved names, adapter_config.json) of an adapter directory."""
    p = Path(path)
    if not is_adapter_dir(p):
        raise FileNotFoundError(
            f"{p} is not a PEFT adapter directory (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})"
        )
    return load_file(p / ADAPTER_WEIGHTS), json.loads((p / ADAPTER_CONFIG).read_text())


@contextmanager
def quiet_peft() -> Iterator[None]:
    """peft flips `fan_in_fan_out` for GPT-2's Conv1D projections and warns that it did:
    expected here, and the flipped value is what the adapter config then records."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*", category=UserWarning)
        yield
