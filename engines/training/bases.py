"""One resident base per (model, dtype, device) in a training process; an adapter per agent.

The base is a `peft.PeftModel` over the HF model, loaded when the first LoRA agent of that
model is built in this process and dropped when its last adapter leaves. Every LoRA trainer
of that model adds its own named adapter to it (`add_adapter`), so N agents cost one base
plus N adapters, and a slot swap moves an adapter and its optimizer state (megabytes), never
the base. Each forward pass first makes its agent's adapter the active one (`set_adapter`);
tasks of one worker run one at a time (one thread per worker), and a lock guards the base
for callers that do not.

Adapter names inside the shared PeftModel are `flexmarl<k>`, unique per process, never the
agent's name: an agent called `v` would otherwise collide with module names when peft's
saved names are formed. The state names are PEFT's saved names (the adapter segment
removed), exactly what `adapter_model.safetensors` holds.

The KL reference is the same base with every adapter disabled (`disable_adapter()`): the
agent's initial policy, since a fresh adapter (B = 0) is the identity — no second copy.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from engines.training.lora import LoraConfig, adapter_config_json, quiet_peft
from engines.training.train_config import DTYPES, TrainConfig

ADAPTER_LAYERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")
_NAMES = itertools.count()


@dataclass(eq=False)
class _Base:
    model: Any  # peft.PeftModel
    adapters: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)


_BASES: dict[tuple[str, str, str], _Base] = {}
_REGISTRY = threading.Lock()


def attach(
    model_path: str, dtype: str, device: str, cfg: LoraConfig, seed: int
) -> tuple[_Base, str]:
    """Add a fresh adapter for `cfg` to this process's base (loading the base first if
    none is resident); returns the base and the adapter's name. The adapter's random init
    (A; B = 0) is drawn from `seed` right before it is created, so a trainer rebuilt on a
    restarted worker starts from the same adapter whether or not the base was resident."""
    import peft
    from transformers import AutoModelForCausalLM

    key = (model_path, dtype, str(torch.device(device)))
    name = f"flexmarl{next(_NAMES)}"
    with _REGISTRY, quiet_peft():
        base = _BASES.get(key)
        if base is None:
            hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
            hf.to(torch.device(device))  # type: ignore[arg-type]
            torch.manual_seed(seed)
            model = peft.get_peft_model(hf, cfg.peft(model_path), adapter_name=name)
            model.eval()  # dropout off: see the trainer's docstring
            base = _BASES[key] = _Base(model)
        else:
            with base.lock:
                torch.manual_seed(seed)
                base.model.add_adapter(name, cfg.peft(model_path))
                base.model.to(torch.device(device))  # the new adapter's tensors
        base.adapters.add(name)
    return base, name


def detach(base: _Base, name: str) -> None:
    """Remove adapter `name`; the base goes when its last adapter does."""
    with _REGISTRY, base.lock:
        base.adapters.discard(name)
        if not base.adapters:
            for key in [k for k, b in _BASES.items() if b is base]:
                del _BASES[key]
            return
        if name in base.model.peft_config:
            if name in base.model.active_adapters:  # deleting the active one warns
                base.model.set_adapter(next(iter(base.adapters)))
            base.model.delete_adapter(name)


def resident_bases() -> dict[tuple[str, str, str], int]:
    """(model, dtype, device) → adapters on it, for this process (tests, reports)."""
    with _REGISTRY:
        return {k: len(b.adapters) for k, b in _BASES.items()}


def saved_name(param_name: str, adapter: str) -> str | None:
    """PEFT's saved name of an adapter parameter (`….lora_A.<adapter>.weight` →
    `….lora_A.weight`), or None when the parameter is not `adapter`'s."""
    parts = param_name.split(".")
    for i in range(1, len(parts)):
        if parts[i] == adapter and parts[i - 1] in ADAPTER_LAYERS:
            return ".".join(parts[:i] + parts[i + 1 :])
    return None


class LoraWeights:
    """One agent's adapter on this process's shared base (see the module docstring)."""

    def __init__(self, model_path: str, config: TrainConfig, device: str) -> None:
        if config.lora is None:
            raise ValueError("LoraWeights needs a TrainConfig with `lora` set")
        self.model_path, self.dtype, self.cfg = model_path, config.dtype, config.lora
        self.seed = config.seed
        self.device = torch.device(device)
        self._attach()

    def _attach(self) -> None:
        self._base, self.adapter = attach(
            self.model_path, self.dtype, str(self.device), self.cfg, self.seed
        )
        peft_model = self._base.model
        self.module: nn.Module = peft_model.get_base_model()  # the HF model, adapters inside
        self._params: dict[str, nn.Parameter] = {}
        for n, p in peft_model.named_parameters():
            saved = saved_name(n, self.adapter)
            if saved is not None:
                self._params[saved] = p
        if not self._params:
            raise ValueError(f"LoRA target_modules {self.cfg.target_modules!r} matched nothing")
        self._trainable = {p: n for n, p in self._params.items()}
        self._dropouts = [  # this adapter's dropout modules (identity when dropout = 0)
            m.lora_dropout[self.adapter]
            for m in peft_model.modules()
            if hasattr(m, "lora_dropout") and self.adapter in m.lora_dropout
        ]

    @property
    def trainable(self) -> dict[nn.Parameter, str]:
        return self._trainable

    def names(self) -> list[str]:
        return list(self._params)

    def tensors(self) -> dict[str, Tensor]:
        return {n: p.detach() for n, p in self._params.items()}

    def published(self) -> dict[str, Tensor]:
        """The adapter in float32 (peft keeps adapters in float32 over a bf16 base): vLLM
        and peft cast it to the base's dtype when they load it; it is megabytes."""
        return self.tensors()

    def assign(self, tensors: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for n, p in self._params.items():
                p.data = tensors[n].to(self.device, dtype=p.dtype)

    def release(self) -> None:
        with torch.no_grad():
            for p in self._params.values():
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                p.grad = None

    def to_device(self, device: str) -> bool:
        """Move to the base on `device` (another adapter there; the old one is given back)."""
        if torch.device(device) == self.device:
            return False
        old_base, old_name = self._base, self.adapter
        self.device = torch.device(device)
        self._attach()
        detach(old_base, old_name)
        return True

    @contextmanager
    def active(self, dropout: bool = False) -> Iterator[None]:
        """This agent's adapter active (and trainable); its dropout on only with `dropout`."""
        with self._base.lock:
            self._base.model.set_adapter(self.adapter)
            for d in self._dropouts:
                d.train(dropout)
            try:
                yield
            finally:
                for d in self._dropouts:
                    d.eval()

    def reference(self, fn: Callable[[nn.Module], Tensor]) -> Tensor:
        """The base with every adapter off: this agent's version-0 policy (B = 0)."""
        with self._base.lock, self._base.model.disable_adapter():
            return fn(self.module)

    def describe(self) -> dict[str, Any]:
        return {"lora": adapter_config_json(self._base.model.peft_config[self.adapter])}

    def close(self) -> None:
        detach(self._base, self.adapter)
