"""The one way a command reads a MEG: parse, validate against this project's registries,
and check what only the models can tell (LoRA targets, vLLM's LoRA support).

`meg` validates the spec on its own terms (it imports nothing of the project); this module
adds the registries (rewards, loss names) and, when the models are checked, the model-level
facts, so `flexmarl meg validate`, `flexmarl train`, `evaluate` and a resumed run all reject
the same mistakes with the same message, naming the file and the field, before any server
or cluster starts.
"""

from __future__ import annotations

from pathlib import Path

from engines.training import loss_names
from meg import MEGError, MEGSpec, is_hub_name, load_meg, validate
from workloads import resolve_config
from workloads.rewards import known_rewards


def load_config(name: str, *, check_models: bool = True) -> MEGSpec:
    """A built-in workload name or a YAML path → the validated spec."""
    path = resolve_config(name)
    spec = load_meg(
        path, known_rewards=known_rewards(), known_losses=loss_names(), check_models=check_models
    )
    if check_models:
        check_lora(spec, str(path))
    return spec


def validate_spec(spec: MEGSpec, source: str) -> MEGSpec:
    """Re-validate a spec read back from a run record (its models are checked at train)."""
    return validate(spec, source=source, known_rewards=known_rewards(), known_losses=loss_names())


def check_lora(spec: MEGSpec, source: str) -> None:
    """Every LoRA agent's targets exist in its model, and its engine can serve adapters.

    Local models only (a hub model is checked where it is downloaded: on the workers)."""
    from engines.training.lora import LoraConfig, adapter_parameters

    for name, agent in spec.agents.items():
        lora = LoraConfig.from_json(None if agent.lora is None else agent.lora.model_dump())
        if lora is None or is_hub_name(agent.model):
            continue
        try:
            adapter_parameters(agent.model, lora)
        except ValueError as e:
            raise MEGError(
                str(e), source=source, field=f"agents.{name}.lora.target_modules"
            ) from None
        if agent.backend == "vllm":
            from engines.rollout.vllm_backend import lora_architecture_problem

            problem = lora_architecture_problem(Path(agent.model))
            if problem:
                raise MEGError(problem, source=source, field=f"agents.{name}.backend")
