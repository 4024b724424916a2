"""An `AgentTrainer`'s state as one flat `dict[str, Tensor]` and a JSON-able meta dict: what
the StateStore swaps, handovers move and checkpoints write (safetensors + JSON, no pickle).

Names: `model/<name>` (an HF checkpoint name, or PEFT's saved adapter name under LoRA —
never the shared base), `optim/<name>/<exp_avg|exp_avg_sq|step>`, `rng/cpu`, and while a
step is in progress `grad/<name>` (the slot manager may swap an agent out between two
micro-batches; its accumulation must travel with it). The trainer's `state()`, `meta()` and
`load_state()` are these three functions; they live apart so the trainer module holds the
training math only.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Protocol

import torch
from torch import Tensor

from engines.training.accum import Accum
from engines.training.train_config import STATE_FORMAT, TrainConfig
from engines.training.weights import PolicyWeights


class AgentTrainer(Protocol):
    """What of `trainer.AgentTrainer` its state touches (a protocol: no import circle)."""

    agent: str
    model_path: str
    config: TrainConfig
    policy: PolicyWeights
    optimizer: torch.optim.Optimizer
    version: int
    skipped_steps: int

    @property
    def device(self) -> torch.device: ...
    @property
    def pending(self) -> bool: ...
    def pending_accum(self) -> Accum | None: ...
    def set_pending(self, acc: Accum | None) -> None: ...
    def rebuild_optimizer(self) -> None: ...


def tensors_of(tr: AgentTrainer) -> dict[str, Tensor]:
    """Own weights + optimizer + RNG (+ pending gradients), no copies."""
    out = {f"model/{k}": v for k, v in tr.policy.tensors().items()}
    for p, name in tr.policy.trainable.items():
        for k, v in tr.optimizer.state.get(p, {}).items():
            out[f"optim/{name}/{k}"] = v.detach() if isinstance(v, Tensor) else torch.tensor(v)
    out["rng/cpu"] = torch.get_rng_state()
    if tr.pending:  # a step in progress: its gradients travel too
        for p, name in tr.policy.trainable.items():
            if p.grad is not None:
                out[f"grad/{name}"] = p.grad.detach()
    return out


def meta_of(tr: AgentTrainer) -> dict[str, Any]:
    """The JSON-able counterpart of `tensors_of`."""
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
        for g in tr.optimizer.param_groups
    ]
    pending = tr.pending_accum()
    return {
        "format": STATE_FORMAT,
        "agent": tr.agent,
        "model_path": tr.model_path,
        "version": tr.version,
        "skipped_steps": tr.skipped_steps,
        "param_groups": groups,
        "config": asdict(tr.config),
        "pending": None if pending is None else pending.to_json(),
    }


def load_into(
    tr: AgentTrainer, tensors: dict[str, Tensor], meta: dict[str, Any], device: str | None
) -> None:
    """Adopt a state (moved to the device, no copy); `device` rebinds the trainer to another
    device (a different slot) on the way in."""
    if meta.get("format") != STATE_FORMAT:
        raise ValueError(f"state format {meta.get('format')!r}, expected {STATE_FORMAT}")
    model_keys = {k[len("model/") :] for k in tensors if k.startswith("model/")}
    expected = set(tr.policy.names())
    if model_keys != expected:
        missing, extra = sorted(expected - model_keys), sorted(model_keys - expected)
        raise ValueError(f"{tr.agent}: state keys differ: missing {missing[:5]}, extra {extra[:5]}")
    if device is not None and tr.policy.to_device(device):
        tr.rebuild_optimizer()  # new Parameter objects (another base)
    tr.policy.assign({k: tensors[f"model/{k}"] for k in model_keys})
    tr.optimizer.state.clear()
    for p, name in tr.policy.trainable.items():
        st = {
            k.rsplit("/", 1)[1]: _optim_value(tr, k.rsplit("/", 1)[1], v, p)
            for k, v in tensors.items()
            if k.startswith(f"optim/{name}/")
        }
        if st:
            tr.optimizer.state[p] = st
    for g, saved in zip(tr.optimizer.param_groups, meta["param_groups"], strict=True):
        g.update({k: (tuple(v) if isinstance(v, list) else v) for k, v in saved.items()})
    if "rng/cpu" in tensors:
        torch.set_rng_state(tensors["rng/cpu"].to("cpu", torch.uint8))
    tr.version = int(meta["version"])
    tr.skipped_steps = int(meta["skipped_steps"])
    pending = meta.get("pending")
    tr.set_pending(None if pending is None else Accum.from_json(pending))
    for p, name in tr.policy.trainable.items():
        grad = tensors.get(f"grad/{name}")
        p.grad = None if grad is None else grad.to(tr.device, dtype=p.dtype)


def _optim_value(tr: AgentTrainer, key: str, value: Tensor, param: Tensor) -> Tensor:
    """An AdamW state entry on its way in: moments on the parameter's device and dtype; the
    step counter stays a CPU tensor, except for the fused kernel, which reads it on the
    device (as `Optimizer.load_state_dict` places it)."""
    if key in ("exp_avg", "exp_avg_sq"):
        return value.to(tr.device, dtype=param.dtype)
    if key == "step" and tr.optimizer.defaults.get("fused"):
        return value.to(tr.device, dtype=torch.float32)
    return value
