"""What a trainer trains: a whole model, or an adapter on a shared base (`lora.py`).

The trainer (`trainer.py`) never asks which: it talks to a `PolicyWeights`, whose *state
names* are at once the names in `state()` (`model/<name>`), in checkpoints and in the
weights published to rollout hosts — HF checkpoint names for a full model, PEFT's saved
names (`base_model.model.….lora_A.weight`) for an adapter. So a swap, a checkpoint and a
publication move exactly the tensors that are the agent's own, and nothing of a base that
other agents share.

`make_weights` picks the implementation from the agent's config (`lora` set or not); that
is the one place the distinction is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from engines.families import checkpoint_names
from engines.training.reference import reference_model
from engines.training.train_config import DTYPES, MASTER_DTYPE, TrainConfig


class PolicyWeights(Protocol):
    """The trainable part of one agent and the module its forward passes run through."""

    module: nn.Module  # the HF causal LM a forward pass calls (adapters inside, if any)
    device: torch.device

    @property
    def trainable(self) -> dict[nn.Parameter, str]:
        """Parameter → state name, for the optimizer (the agent's own parameters only)."""
        ...

    def names(self) -> list[str]:
        """State names, in a stable order."""
        ...

    def tensors(self) -> dict[str, Tensor]:
        """State name → the live tensor (no copy): the float32 masters."""
        ...

    def published(self) -> dict[str, Tensor]:
        """State name → what rollout hosts load: the weights in the agent's compute dtype."""
        ...

    def assign(self, tensors: dict[str, Tensor]) -> None:
        """Adopt `tensors` (state names) as the weights, on `device`."""
        ...

    def release(self) -> None:
        """Drop the tensors `tensors()` returns (a swapped-out agent keeps only modules)."""
        ...

    def to_device(self, device: str) -> bool:
        """Rebind to another device; True if the trainable Parameter objects changed."""
        ...

    def active(self, dropout: bool = False) -> AbstractContextManager[None]:
        """Context in which `module` computes this agent's policy (`dropout`: the adapter's
        dropout on, for the gradient pass)."""
        ...

    def reference(self, fn: Callable[[nn.Module], Tensor]) -> Tensor:
        """`fn` applied to the frozen initial policy (for the KL term)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-able facts published with the weights (an adapter's config)."""
        ...

    def close(self) -> None:
        """Give back what is shared (an adapter's place on its base)."""
        ...


class FullWeights:
    """A whole model, owned by one agent: its own copy of every weight, held in float32
    (the masters an AdamW step updates); forward passes compute in the agent's dtype under
    autocast, and `published()` casts to it."""

    def __init__(self, model_path: str, config: TrainConfig, device: str) -> None:
        self.model_path, self.dtype = model_path, config.dtype
        self.device = torch.device(device)
        self.module: nn.Module = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=MASTER_DTYPE
        )
        self.module.to(self.device)  # type: ignore[arg-type]
        self.module.eval()  # dropout off: see the trainer's docstring
        # everything a fresh checkpoint of the family holds (tied aliases dropped)
        self._names = checkpoint_names(self.module)
        self._trainable = {p: n for n, p in self.module.named_parameters() if p.requires_grad}

    @property
    def trainable(self) -> dict[nn.Parameter, str]:
        return self._trainable

    def names(self) -> list[str]:
        return list(self._names)

    def _by_name(self) -> dict[str, Tensor]:
        return dict(self.module.named_parameters()) | dict(self.module.named_buffers())

    def tensors(self) -> dict[str, Tensor]:
        sd = self.module.state_dict()
        return {k: sd[k].detach() for k in self._names}

    def published(self) -> dict[str, Tensor]:
        """The masters cast to the compute dtype (no copy in float32)."""
        cast = DTYPES[self.dtype]
        return {k: v.to(cast) if v.is_floating_point() else v for k, v in self.tensors().items()}

    def assign(self, tensors: dict[str, Tensor]) -> None:
        """Adopt `tensors`, each in its parameter's own dtype (a checkpoint of a run from
        before float32 masters, in bf16, is upcast)."""
        by_name = self._by_name()
        with torch.no_grad():
            for k in self._names:
                t = by_name[k]
                dtype = t.dtype if tensors[k].is_floating_point() else None
                t.data = tensors[k].to(self.device, dtype=dtype)
            for name, buf in self.module.named_buffers():  # non-persistent: follow the device
                if name not in tensors:
                    buf.data = buf.data.to(self.device)

    def release(self) -> None:
        """Non-persistent buffers (rotary `inv_freq`) stay: they are derived and tiny."""
        by_name = self._by_name()
        with torch.no_grad():
            for k in self._names:
                t = by_name[k]
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
                t.grad = None

    def to_device(self, device: str) -> bool:
        self.device = torch.device(device)  # `assign` moves the tensors
        return False

    @contextmanager
    def active(self, dropout: bool = False) -> Iterator[None]:
        yield

    def reference(self, fn: Callable[[nn.Module], Tensor]) -> Tensor:
        return fn(reference_model(self.model_path, self.dtype, str(self.device)))

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def make_weights(model_path: str, config: TrainConfig, device: str) -> PolicyWeights:
    """Full weights, or (with `config.lora`) an adapter on this process's shared base."""
    if config.lora is None:
        return FullWeights(model_path, config, device)
    from engines.training.bases import LoraWeights

    return LoraWeights(model_path, config, device)
