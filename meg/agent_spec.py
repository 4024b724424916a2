"""An agent's blocks in a MEG file (`agents: NAME:`): its model, sampling defaults,
optimizer, loss and LoRA adapter. Split from `meg.spec`, which re-exports them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from meg.frozen import Frozen, flag_block


class SamplingSpec(Frozen):
    """Sampling defaults of an agent; a node may override `max_tokens`."""

    temperature: float = Field(
        1.0,
        gt=0.0,
        description="Sampling temperature (> 0: greedy decoding is not a policy to train). The "
        "trainer's logprobs use the same temperature (logits / T).",
    )
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling. Below 1 the sampler's logprobs are renormalised in the "
        "nucleus, which the trainer's full-vocabulary logprobs are not: keep 1 for training "
        "unless the truncated importance weight (loss.is_cap) is meant to absorb the gap.",
    )
    max_tokens: int = Field(32, ge=1)


class OptimSpec(Frozen):
    lr: float = Field(1e-5, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(
        1.0, ge=0.0, description="Max global gradient norm; 0 disables clipping."
    )
    packing: Literal["none", "by_length"] = Field(
        "by_length",
        description="How a micro-batch's rows go through the model: `by_length` (rows of "
        "similar length grouped, each group padded only to its own longest row; the same "
        "loss, gradients and metrics as `none`, less compute on ragged lengths) or `none` "
        "(every row padded to the micro-batch's longest). "
        "docs/training.md#padding-free-training",
    )


class EchoSpec(Frozen):
    """EchoRL's auxiliary loss (arXiv 2605.31228): a group whose rollouts all succeeded has
    advantage 0 everywhere and teaches the policy loss nothing; EchoRL picks one success in
    such a group and adds `coef` × its negative log-likelihood on a prefix, the "EchoClip",
    which ends at the response's step of highest entropy (where the policy was least sure,
    and got it right). Steps end at a token whose text contains `delimiter`; a step's
    entropy is estimated by the mean surprisal −log μ of its sampled tokens, which the
    store already holds (no extra forward pass). See engines/training/echo.py."""

    coef: float = Field(
        0.001, gt=0.0, le=10.0, description="Weight of the clip's NLL term (the paper's 0.001)."
    )
    success: float = Field(
        1.0, description="A rollout succeeded when its reward is at least this (the paper's 1.0)."
    )
    delimiter: str = Field(
        "\n",
        min_length=1,
        description="Text that ends a reasoning step (the paper splits at newlines).",
    )


class LossSpec(Frozen):
    """Names resolve through the training engine's registries; `meg validate` checks them
    (the caller passes the known names, so `meg` imports nothing of the engines)."""

    advantage: str = "grpo"
    policy_loss: str = "grpo"
    aggregation: str = "token-mean"
    clip_eps: float = Field(0.2, gt=0.0)
    clip_eps_high: float | None = Field(
        None, gt=0.0, description="Upper clip (DAPO clip-higher); default: clip_eps."
    )
    dual_clip: float | None = Field(
        None, gt=1.0, description="Dual-clip PPO: cap a negative-advantage token's loss at c·|A|."
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="β of the k3 KL to the agent's initial weights (0: no KL)."
    )
    old_logprobs: str = Field(
        "recompute",
        description="PPO anchor: `recompute` (the trainer's own logprobs before the update, "
        "plus a truncated importance weight for the sampler gap), `behaviour` (the "
        "sampler's stored logprobs), `sparse_rl` (recompute with Sparse-RL's rejection and "
        "reweighting, for the `sparse` rollout policy) or `external` (recompute on the "
        "agent's own rows, LUFFY's shaped importance weight on an external policy's rows, for "
        "the `external` rollout policy).",
    )
    shaping: float = Field(
        0.1,
        gt=0.0,
        le=100.0,
        description="γ of the policy shaping f(x) = x/(x+γ) of the importance ratio x = "
        "πθ/μ on rows an external policy sampled (`external` anchor; LUFFY's 0.1): the "
        "smaller, the more a token the agent finds unlikely is learned from.",
    )
    is_cap: float = Field(
        2.0, ge=1.0, description="Cap of the truncated importance weight (recompute anchor)."
    )
    skip_zero_advantage: bool = Field(
        False,
        description="Skip the forward and backward of sequences whose advantage is exactly "
        "0 (their gradient is 0); the normaliser still counts them, so the gradient is the "
        "same. Applies when kl_coef is 0 and the policy loss declares it exact.",
    )
    credit: str = Field(
        "episode",
        description="How a loop's turns share credit (`engines.training.turn_credit`): "
        "`episode` (every turn gets its rollout's outcome advantage), `turn` (each turn's own "
        "reward, against the same round of the group's other rollouts) or `crbc` (Cross-"
        "Rollout Bellman Closure: per-turn values from states merged across the group). "
        "Nodes outside loops are scored per invocation whatever this says.",
    )
    echo: EchoSpec | None = Field(
        None,
        description="EchoRL: an NLL term on a success rollout's prefix in all-success groups "
        "(`echo: true`: the paper's defaults).",
    )

    @field_validator("echo", mode="before")
    @classmethod
    def _echo_flag(cls, v: Any) -> Any:
        return flag_block(EchoSpec, v)


class LoraSpec(Frozen):
    """A LoRA adapter (Hu et al. 2021) on the agent's `model`, with PEFT's meanings.

    Agents whose `model`, `backend` and `dtype` agree share one resident base everywhere
    weights live (rollout engine, training worker); each is an adapter on it. `lora: true`
    takes every default."""

    r: int = Field(8, ge=1, le=256, description="Adapter rank.")
    alpha: float = Field(16.0, gt=0.0, description="Scale α: the update is (α / r)·B·A.")
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapter's input in the gradient pass only (the anchor, "
        "reference and rollout logprobs run without it, so it perturbs the ratio: keep 0 "
        "unless you want the regularisation).",
    )
    target_modules: list[str] | str | None = Field(
        None,
        description="Module-name suffixes to adapt, `all-linear`, or None: PEFT's default "
        "for the architecture (q_proj and v_proj for Llama and Qwen).",
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | str | None) -> list[str] | str | None:
        if isinstance(v, str) and v != "all-linear":
            raise ValueError(
                f"target_modules must be a list of module names or 'all-linear', got {v!r}"
            )
        if isinstance(v, list) and not v:
            raise ValueError("target_modules is empty: name at least one module, or omit it")
        return v


class AgentSpec(Frozen):
    """A trainable policy: its own weights, optimizer and sampling defaults."""

    model: str = Field(description="Local model directory or Hugging Face hub name.")
    tokenizer: str | None = Field(None, description="Defaults to `model`.")
    backend: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description="Rollout engine. `auto`: chosen when the run starts (hf for a small "
        "model on short prompts on a CPU, else vllm: flows.runs.engine_choice).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Precision of the trainer and of the rollout engine."
    )
    sampling: SamplingSpec = SamplingSpec()
    optim: OptimSpec = OptimSpec()
    loss: LossSpec = LossSpec()
    lora: LoraSpec | None = Field(
        None,
        description="Train a LoRA adapter on `model` instead of full weights (`true`: defaults).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_placement(cls, data: Any) -> Any:
        """Placement is decided from measured load, not written in the MEG (an early format
        had a `placement:` block that was never honoured)."""
        if isinstance(data, dict) and "placement" in data:
            raise ValueError(
                "`placement` is not an agent field: the balancer places rollouts from measured "
                "load and each weight unit trains on one training worker; remove it"
            )
        return data

    @field_validator("lora", mode="before")
    @classmethod
    def _lora_flag(cls, v: Any) -> Any:
        return flag_block(LoraSpec, v)  # `lora: false`: full weights

    @property
    def tokenizer_path(self) -> str:
        """Where the agent's tokenizer is: `tokenizer`, else the model's own."""
        return self.tokenizer or self.model
