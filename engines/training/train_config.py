"""Values at the trainer's boundary: the agent's optimizer/loss settings (`TrainConfig`,
mapped one-to-one from the MEG's `optim:` and `loss:` fields), the outcome of a step, and the
error a step raises when its micro-batches are not the step's."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from engines.training.advantages import ADVANTAGES
from engines.training.aggregate import AGGREGATIONS
from engines.training.lora import LoraConfig
from engines.training.losses import ANCHORS, POLICY_LOSSES
from engines.training.packing import check_packing
from meg.agent_spec import AgentSpec, LossSpec, OptimSpec, SamplingSpec

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
STATE_FORMAT = 1
# What trainable weights and their AdamW moments are kept in, whatever the agent's dtype: the
# agent's `dtype` is the *compute* dtype (autocast) and what rollout hosts get. A pure bf16
# parameter rounds away any update below ~2^-8 of its magnitude: at lr 1e-6 one AdamW step
# moved 2% of a bf16 model's weights (100% in fp32). Memory per trainable parameter: 4 (fp32
# weight) + 4 (fp32 grad) + 8 (AdamW moments) = 16 bytes, plus autocast's transient bf16 copy
# (2) during a forward and the published bf16 copy (2) after a step.
MASTER_DTYPE = torch.float32


def autocast(device: torch.device, dtype: str) -> AbstractContextManager[Any]:
    """Compute in `dtype` over float32 master weights (a no-op for float32): matmuls in
    bf16/fp16, reductions and `log_softmax` in float32 (torch's autocast op lists)."""
    if DTYPES[dtype] == MASTER_DTYPE:
        return nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


# the defaults of `optim:` and `loss:`, written once in the MEG spec (meg/agent_spec.py)
_OPTIM, _LOSS, _SAMPLING = OptimSpec(), LossSpec(), SamplingSpec()


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Optimizer and loss settings of one agent; names refer to the registries. Every field
    of `optim:` and `loss:` has its default from the spec, so the two cannot drift."""

    lr: float = _OPTIM.lr
    betas: tuple[float, float] = _OPTIM.betas
    weight_decay: float = _OPTIM.weight_decay
    grad_clip: float = _OPTIM.grad_clip  # max global grad norm; 0 disables clipping
    packing: str = _OPTIM.packing  # how a micro-batch's rows are batched (packing.PACKINGS)
    advantage: str = _LOSS.advantage
    policy_loss: str = _LOSS.policy_loss
    aggregation: str = _LOSS.aggregation
    clip_eps: float = _LOSS.clip_eps
    clip_eps_high: float | None = _LOSS.clip_eps_high
    dual_clip: float | None = _LOSS.dual_clip  # c > 1 caps a negative-advantage token's loss
    kl_coef: float = _LOSS.kl_coef
    old_logprobs: str = _LOSS.old_logprobs  # the PPO anchor (losses.ANCHORS)
    is_cap: float = _LOSS.is_cap  # truncation of the sampler-mismatch importance weight
    shaping: float = _LOSS.shaping  # γ of the external rows' shaped weight (`external` anchor)
    skip_zero_advantage: bool = _LOSS.skip_zero_advantage  # accum.kept_rows
    echo_coef: float = 0.0  # EchoRL's NLL weight on clip tokens (loss.echo.coef; 0: off)
    temperature: float = _SAMPLING.temperature  # the agent's: logprobs of logits / T
    seed: int = 0
    dtype: str = "float32"  # compute + publication dtype; masters are MASTER_DTYPE
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        ADVANTAGES.get(self.advantage)  # unknown names raise, listing known ones
        POLICY_LOSSES.get(self.policy_loss)
        AGGREGATIONS.get(self.aggregation)
        ANCHORS.get(self.old_logprobs)
        check_packing(self.packing)
        if self.dtype not in DTYPES:
            raise ValueError(f"TrainConfig.dtype {self.dtype!r} unknown; known: {sorted(DTYPES)}")
        if self.lr <= 0 or self.clip_eps <= 0 or self.grad_clip < 0 or self.kl_coef < 0:
            raise ValueError("TrainConfig: lr and clip_eps must be > 0, grad_clip, kl_coef >= 0")
        if self.echo_coef < 0:
            raise ValueError(f"TrainConfig.echo_coef must be >= 0, got {self.echo_coef}")
        if self.shaping <= 0:
            raise ValueError(f"TrainConfig.shaping must be > 0, got {self.shaping}")
        if self.temperature <= 0 or self.is_cap < 1:
            raise ValueError("TrainConfig: temperature must be > 0 and is_cap >= 1")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"TrainConfig.dual_clip must be > 1, got {self.dual_clip}")

    @classmethod
    def from_agent(cls, agent: AgentSpec, seed: int = 0) -> TrainConfig:
        """The one mapping from the user's spec: every `optim:` and `loss:` field by name (a
        spec field without a counterpart here raises, so none is dropped on the way), plus
        the sampling temperature, the dtype and the LoRA adapter (`lora:`)."""
        fields: dict[str, Any] = {**agent.optim.model_dump(), **agent.loss.model_dump()}
        fields["betas"] = tuple(fields["betas"])
        echo = fields.pop("echo")  # the clip choice is the driver's; the trainer weighs it
        fields.pop("credit")  # a loop's turn credit is the score task's (`tasks.loop_credit`)
        fields["echo_coef"] = 0.0 if echo is None else float(echo["coef"])
        lora = LoraConfig.from_json(None if agent.lora is None else agent.lora.model_dump())
        return cls(
            **fields,
            temperature=agent.sampling.temperature,
            dtype=agent.dtype,
            seed=seed,
            lora=lora,
        )


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one `step()`; `version` is the policy version after it."""

    version: int
    skipped: bool
    loss: float  # sum over micro-batches of the aggregated loss = the full-batch loss
    grad_norm: float  # before clipping
    num_tokens: int
    num_seqs: int
    metrics: dict[str, float] = field(default_factory=dict)
    step: int | None = None  # the step number begin_step declared
    parts: dict[int, tuple[int, int]] = field(default_factory=dict)  # mb → (tokens, seqs)


class StepMismatchError(ValueError):
    """The accumulated micro-batches are not the step's: stepping would train a partial or
    double-counted batch."""
