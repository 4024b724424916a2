"""LoRA adapters (Hu et al. 2021) on a frozen, shared base model — PEFT-compatible names.

Why not PEFT itself: PEFT wraps the model and renames every parameter, pulls in
`accelerate`, and its wrapper would have to be swapped as a whole. Here an adapter is two
small `nn.Linear` submodules added *inside* each targeted `nn.Linear` plus a forward hook
(y = W x + (α/r)·B A drop(x)), so

- the HF module tree and base parameter names are untouched (`…q_proj.weight`),
- adapter parameters are named `…q_proj.lora_A.weight` / `…lora_B.weight`, which is PEFT's
  saved format after the `base_model.model.` prefix (`peft_state_dict`), so
  `save_adapter` writes a directory PEFT and vLLM's LoRA loader read,
- init follows PEFT: A ~ kaiming-uniform(a=√5), B = 0, so a fresh adapter is a no-op.

The frozen base is *shared*: `share_base` points every trainer's frozen tensors of the same
(model path, dtype, device) at one copy, so N agents cost one base plus N adapters.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """Adapter settings with PEFT's meanings; `target_modules` match module-name suffixes."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha <= 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig: need r >= 1, alpha > 0, 0 <= dropout < 1; got {self}")
        if not self.target_modules:
            raise ValueError("LoraConfig.target_modules is empty: name at least one Linear")


def _hook(scaling: float, dropout: float) -> Any:
    def hook(mod: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> Tensor:
        x = inputs[0]  # (…, in)
        if dropout and mod.training:
            x = nn.functional.dropout(x, dropout)
        a, b = mod.get_submodule("lora_A"), mod.get_submodule("lora_B")
        return out + b(a(x)) * scaling  # (…, out)

    return hook


def inject_lora(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """Freeze `model`, add adapters to every targeted Linear; returns the targeted names."""
    for p in model.parameters():
        p.requires_grad_(False)
    hit = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in cfg.target_modules:
            w = mod.weight
            a = nn.Linear(mod.in_features, cfg.r, bias=False, device=w.device, dtype=w.dtype)
            b = nn.Linear(cfg.r, mod.out_features, bias=False, device=w.device, dtype=w.dtype)
            nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))
            nn.init.zeros_(b.weight)
            mod.add_module("lora_A", a)
            mod.add_module("lora_B", b)
            mod.register_forward_hook(_hook(cfg.alpha / cfg.r, cfg.dropout))
            hit.append(name)
    if not hit:
        raise ValueError(f"LoRA target_modules {cfg.target_modules} matched no nn.Linear")
    return hit


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merged_weights(model: nn.Module, cfg: LoraConfig) -> dict[str, Tensor]:
    """HF-named weights with W' = W + (α/r)·B A folded in (for hosts without LoRA support)."""
    sd = model.state_dict()
    out = {k: v.detach() for k, v in sd.items() if not is_adapter_key(k)}
    for k in list(out):
        stem = k[: -len(".weight")] if k.endswith(".weight") else None
        if stem and f"{stem}.lora_A.weight" in sd:
            a, b = sd[f"{stem}.lora_A.weight"], sd[f"{stem}.lora_B.weight"]  # (r,in), (out,r)
            out[k] = out[k] + (cfg.alpha / cfg.r) * (b.float() @ a.float()).to(out[k].dtype)
    return out


_BASES: dict[tuple[str, str, str], dict[str, Tensor]] = {}  # per process, see `share_base`


def share_base(model: nn.Module, model_path: str, dtype: torch.dtype, device: str) -> None:
    """Alias this model's frozen tensors to the process-wide copy for (path, dtype, device)."""
    key = (model_path, str(dtype), str(torch.device(device)))
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    cached = _BASES.get(key)
    if cached is None or cached.keys() != frozen.keys():
        _BASES[key] = {n: p.data for n, p in frozen.items()}
        return
    for n, p in frozen.items():
        p.data = cached[n]  # read-only by construction: nobody steps a frozen tensor


def save_adapter(
    adapter: dict[str, Tensor], cfg: LoraConfig, base_model: str, out_dir: str | Path
) -> Path:
    """Write a PEFT adapter directory: adapter_config.json + adapter_model.safetensors."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in adapter.items()},
        out / "adapter_model.safetensors",
    )
    conf = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": list(cfg.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(conf, indent=1))
    return out
