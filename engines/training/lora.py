"""LoRA adapters (Hu et al. 2021) with `peft`: the config, the adapter directory, merging.

An adapter directory is PEFT's own layout — `adapter_config.json` + `adapter_model.safetensors`
with PEFT's saved names (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`) —
so `peft.PeftModel.from_pretrained(base, dir)` and vLLM's `LoRARequest(name, id, dir)` load
what we write, and we load what they write. The same names are the agent's state names in
the trainer, its checkpoints and its published weights (`weights.py`).

The config JSON is written by peft's own `LoraConfig`, so every field (`r`, `lora_alpha`,
`target_modules`, `fan_in_fan_out`, ...) means what peft and vLLM say it means. `target_modules
= None` takes peft's default for the architecture (`q_proj`, `v_proj` for Llama and Qwen).

Where the base lives and how several agents share it: `bases.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    is_adapter_dir,
    quiet_peft,
    read_adapter,
    write_adapter,
)

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "LoraConfig",
    "adapter_config_json",
    "adapter_parameters",
    "is_adapter_dir",
    "merge_adapter",
    "quiet_peft",
    "read_adapter",
    "write_adapter",
]


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """An agent's adapter settings (the engine-side value of the MEG's `lora:`)."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str | None = None  # names, "all-linear", or peft's default

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha <= 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig: need r >= 1, alpha > 0, 0 <= dropout < 1; got {self}")
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            raise ValueError(
                f"LoraConfig.target_modules {self.target_modules!r}: a tuple or 'all-linear'"
            )
        if isinstance(self.target_modules, tuple) and not self.target_modules:
            raise ValueError("LoraConfig.target_modules is empty: name at least one module")

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LoraConfig | None:
        """From `dataclasses.asdict` output (a checkpoint's meta) or a `LoraSpec` dump."""
        if data is None:
            return None
        targets = data.get("target_modules")
        return cls(
            r=int(data["r"]),
            alpha=float(data["alpha"]),
            dropout=float(data.get("dropout", 0.0)),
            target_modules=tuple(targets) if isinstance(targets, list | tuple) else targets,
        )

    def peft(self, base_model: str = "") -> Any:
        """The `peft.LoraConfig` of this adapter."""
        import peft

        targets = self.target_modules
        return peft.LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # peft says int; floats work
            lora_dropout=self.dropout,
            target_modules=list(targets) if isinstance(targets, tuple) else targets,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model or None,
        )


def adapter_config_json(peft_config: Any) -> dict[str, Any]:
    """`adapter_config.json` of a `peft.LoraConfig`, as plain JSON. Take it from the live
    PeftModel (`model.peft_config[name]`): peft resolves `target_modules` there to the real
    module names when the spec said None or `all-linear`, which vLLM needs."""
    out = peft_config.to_dict()
    for k, v in list(out.items()):
        if isinstance(v, set):
            out[k] = sorted(v)
        elif hasattr(v, "value"):  # enums (peft_type, task_type)
            out[k] = v.value
    out["inference_mode"] = True
    return json.loads(json.dumps(out))  # plain JSON types only


def merge_adapter(
    base_model: str, adapter_dir: str | Path, out_dir: str | Path, dtype: Any
) -> Path:
    """A HF model directory with the adapter folded in, through peft itself
    (`PeftModel.from_pretrained(base, adapter).merge_and_unload()`): the path every peft
    user takes, so an exported adapter is known to load."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out = Path(out_dir)
    merged.save_pretrained(out)
    return out


def adapter_parameters(model_path: str, cfg: LoraConfig) -> int:
    """Parameters of this adapter on this model, counted by peft on a weightless (meta)
    copy of the model. Raises `ValueError` naming the modules when the targets match none
    of the model's layers (what `meg validate` reports)."""
    import peft
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    try:
        with quiet_peft():
            wrapped = peft.get_peft_model(model, cfg.peft())
    except ValueError as e:
        raise ValueError(f"LoRA target_modules {cfg.target_modules!r}: {e}") from None
    trainable, _ = wrapped.get_nb_trainable_parameters()
    return int(trainable)
