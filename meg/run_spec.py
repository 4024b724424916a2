"""A run's settings (`run:` in a MEG file): how many steps, the pipeline mode, scoring,
balancing and elastic training allocation. Split from `meg.spec`, which re-exports them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from meg.frozen import Frozen
from meg.limits import MAX_REWARD_PROCESSES, MAX_SEED, MAX_STEP_SAMPLES, MAX_TIMEOUT_S, MAX_WINDOW
from meg.policies import AllPrompts, FullRollout, RolloutPolicy, SelectPolicy


class ScoringSpec(Frozen):
    """How reward calls run and what a failing one costs (docs/rewards.md#failures).

    Every call runs in a reward process with a timeout; a call that raises, returns a
    non-number or runs over is `failed` with the reason in the store, scored by
    `on_failure`, and the run goes on — until more than `max_failed_fraction` of the scored
    samples have failed (counted once `min_samples` are scored), which stops the run.
    """

    timeout_s: float = Field(
        5.0, gt=0.0, le=MAX_TIMEOUT_S, description="Per-call timeout, seconds."
    )
    on_failure: Literal["zero", "drop_group"] = Field(
        "zero",
        description="`zero`: a failed sample gets reward 0 and its group is scored as usual; "
        "`drop_group`: its whole group gets advantage 0 (no learning signal).",
    )
    max_failed_fraction: float = Field(
        0.2, ge=0.0, le=1.0, description="Stop the run when more samples than this failed."
    )
    min_samples: int = Field(
        50, ge=1, description="Scored samples before `max_failed_fraction` is applied."
    )
    processes: int = Field(
        2, ge=1, le=MAX_REWARD_PROCESSES, description="Reward processes per worker."
    )


class RunSpec(Frozen):
    """A run's settings. In a MEG file they are defaults; `flexmarl train` flags override
    them, and the run's resolved copy (`MEGSpec.run` of the spec in `run.json`) is the only
        place the pipeline, the tasks and a resume read them from (`flows.runs.resolve`). The
    `flexmarl train` flags that override them are generated from these fields
    (`flows.runs.resolve.override_fields`): type, bounds and description are declared here only.
    """

    steps: int = Field(10, ge=1, description="Optimizer steps per agent.")
    episodes_per_step: int = Field(
        8, ge=1, le=MAX_STEP_SAMPLES, description="Episodes (prompts of the task) of one step."
    )
    micro_batches: int = Field(
        2, ge=1, description="Micro-batches of one step, each at least one whole episode."
    )
    mode: Literal["sync", "flex", "async"] = Field(
        "flex",
        description="`sync`: a barrier per step; `flex`: zero staleness, without the barrier; "
        "`async`: rows may come from `staleness` policy versions back.",
    )
    staleness: int = Field(
        0, ge=0, description="η of async mode: step k may train on rows of versions >= k - η."
    )
    window: int = Field(
        2, ge=1, le=MAX_WINDOW, description="Steps compiled ahead into the task graph."
    )
    checkpoint_every: int = Field(
        1,
        ge=1,
        description="Optimizer steps between checkpoints (the last step always is). Unset, a "
        "one-agent run checkpoints every 10 steps (flows.runs.resolve.graph_defaults).",
    )
    keep_checkpoints: int = Field(
        2, ge=1, description="Newest checkpoints kept per agent; older ones are deleted."
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of data order and sampling.")
    rollout: RolloutPolicy = Field(
        FullRollout(),
        description="How a step's episodes are launched and cut: `full` (default) or `april` "
        "(over-provisioned, unfinished samples carried to the next step). See meg/policies.py.",
    )
    select: SelectPolicy = Field(
        AllPrompts(),
        description="Which planned prompts are rolled out: `all` (default) or `greso` (skip "
        "prompts whose recent groups all got one reward).",
    )
    scoring: ScoringSpec = Field(
        ScoringSpec(), description="Reward calls: timeout, failure rule, failure budget."
    )
    balance: bool = Field(
        True, description="Hierarchical rollout load balancing (else a static equal split)."
    )
    tracking: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] = Field(
        (),
        description="Experiment trackers the driver logs per-step metrics, the config and the "
        "final models to: `tensorboard`, `wandb` (offline), `mlflow`, several at once "
        "(docs/tracking.md). Needs the `tracking` extra.",
    )
    rollout_gradients: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Back-propagate each micro-batch on the rollout worker that sampled it and "
        "send the gradient to the trainer, which adds the parts and steps (one-node MEG, a "
        "full-weight float32 agent, flex or sync mode). `auto`: on where it was measured "
        "faster, a small model with a rollout worker per micro-batch on a machine without GPUs "
        "(docs/training.md#gradients-on-the-rollout-workers).",
    )
    elastic: bool = Field(
        False,
        description="Elastic training allocation: between steps, move an agent's training to "
        "the worker (training or rollout) with the least measured load, its state handed over "
        "through the StateStore (docs/training.md#elastic-training-allocation).",
    )

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _every_step_was_zero(cls, v: Any) -> Any:
        """MEG files and run records from before meant "every step" by 0."""
        return 1 if v == 0 else v

    @model_validator(mode="after")
    def _whole_episodes(self) -> RunSpec:
        if self.episodes_per_step < self.micro_batches:
            raise ValueError(
                f"episodes_per_step ({self.episodes_per_step}) must be at least micro_batches "
                f"({self.micro_batches}): every micro-batch needs one whole episode"
            )
        return self
