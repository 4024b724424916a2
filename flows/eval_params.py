"""What `flexmarl evaluate` takes (`EvalParams`), apart from the evaluation itself.

Its own light module because the command line builds every command's options at start:
`flows.evaluate` runs the models in this process and pulls in the reward and tool-call code
and torch, which `flexmarl --help` or `flexmarl train` must not pay for (~1.2 s and ~0.3 GB
each time; `tests/flows/test_executors.py`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workloads import BUILTIN


class EvalParams(BaseModel):
    """Parameters of an evaluation. Give exactly one of `checkpoint` and `base`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str = Field(
        "math-chain",
        description=f"MEG YAML file or built-in workload ({', '.join(BUILTIN)})",
    )
    checkpoint: str | None = Field(
        None,
        description="run directory of `flexmarl train` (its final/<agent>/ exports or newest "
        "checkpoints), or one HF model directory used for every agent",
    )
    base: bool = Field(False, description="evaluate the config's initial models instead")
    split: Literal["eval", "train"] = Field("eval", description="which split to evaluate on")
    limit: int | None = Field(None, ge=1, description="first N tasks of the split")
    batch_size: int = Field(64, ge=1, description="prompts per generate call")
    sampling: Literal["greedy", "policy"] = Field(
        "greedy",
        description="greedy: the argmax response; policy: each agent's own sampling "
        "(temperature, top_p), the distribution RL optimises",
    )
    repeats: int = Field(
        1, ge=1, description="episodes per task (with policy sampling: the mean of N samples)"
    )
    json_path: str | None = Field(
        None, description="also write the result as JSON here", json_schema_extra={"cli": "--json"}
    )
