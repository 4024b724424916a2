"""The one way a command reads a MEG: parse, validate against this project's registries,
and check what only the models can tell (LoRA targets, vLLM's LoRA support).

`meg` validates the spec on its own terms (it imports nothing of the project); this module
adds the registries (rewards, loss names) and, when the models are checked, the model-level
facts, so `flexmarl meg validate`, `flexmarl train`, `evaluate` and a resumed run all reject
the same mistakes with the same message, naming the file and the field, before any server
or cluster starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from engines.training.catalog import loss_names, zero_at_zero_advantage
from meg import MEGError, MEGSpec, is_hub_name, load_meg, validate
from meg.sizes import context_problems
from meg.agent_spec import LossSpec
from policies import problems
from workloads import plugins, resolve_config
from workloads.datasets import GENERATORS
from workloads.rewards import check_binding, known_rewards
from workloads.tools import known_tools


def with_plugins(spec: MEGSpec, path: Path) -> MEGSpec:
    """Resolve what the MEG names relative to its own file and import its plug-ins (the
    registries then know their rewards and generators): `plugins:`, and a relative `model`,
    `tokenizer` or dataset `url` that exists next to the MEG (otherwise it stays relative
    to the current directory, as the built-in workloads' `models/tiny-math` is)."""
    try:
        spec = plugins.resolve(spec, path.parent)
        plugins.import_all(spec.plugins)
    except plugins.PluginError as e:
        raise MEGError(str(e), source=str(path), field="plugins") from None
    return next_to(spec, path.parent)


def _beside(value: str | None, base: Path) -> str | None:
    if value is None or "://" in value or Path(value).is_absolute():
        return value
    candidate = base / value
    return str(candidate.resolve()) if candidate.exists() else value


def next_to(spec: MEGSpec, base: Path) -> MEGSpec:
    """`spec` with relative paths that exist under `base` made absolute."""
    agents = {
        name: a.model_copy(
            update={"model": _beside(a.model, base), "tokenizer": _beside(a.tokenizer, base)}
        )
        for name, a in spec.agents.items()
    }
    dataset = spec.dataset.model_copy(update={"url": _beside(spec.dataset.url, base)})
    return spec.model_copy(update={"agents": agents, "dataset": dataset})


def load_config(name: str, *, check_models: bool = True) -> MEGSpec:
    """A built-in workload name or a YAML path → the validated spec."""
    path = resolve_config(name)
    spec = load_meg(
        path,
        known_rewards=known_rewards(),
        known_losses=loss_names(),
        known_tools=known_tools(),
        policy_problems=problems,
        check_models=check_models,
        prepare=with_plugins,
    )
    check_workload(spec, str(path))
    if check_models:
        check_lora(spec, str(path))
        check_chat(spec, str(path))
        check_context(spec, str(path))
    return spec


def check_context(spec: MEGSpec, source: str) -> None:
    """No node's prompt can outgrow its model's context (`meg.sizes.context_problems`);
    local models only: a hub model's config is not fetched for a check."""
    from engines.families import max_positions

    contexts = {}
    for name, agent in spec.agents.items():
        local = model_dir(name, agent.model, source)
        if local is not None:
            cfg = local / "config.json"
            if not cfg.is_file():
                continue
            try:
                contexts[name] = max_positions(json.loads(cfg.read_text()))
            except (OSError, ValueError, AttributeError) as e:
                raise MEGError(
                    f"cannot read {cfg}: {e}", source=source, field=f"agents.{name}.model"
                ) from None
    for field, why in context_problems(spec, contexts)[:1]:
        raise MEGError(why, source=source, field=field)


def check_chat(spec: MEGSpec, source: str) -> None:
    """Every `chat:` node's tokenizer has a chat template that shows the user message."""
    from engines.tokenizers import tokenizer
    from meg.template import chat_frame

    for name, node in spec.nodes.items():
        path = spec.agents[node.agent].tokenizer_path
        if node.chat is None or is_hub_name(path):
            continue
        try:
            chat_frame(tokenizer(path), node.chat.system)
        except ValueError as e:
            raise MEGError(
                f"{e} (tokenizer of agent {node.agent!r})",
                source=source,
                field=f"nodes.{name}.chat",
            ) from None


def validate_spec(spec: MEGSpec, source: str) -> MEGSpec:
    """Re-validate a spec read back from a run record (its models are checked at train);
    its plug-ins are already in canonical form (absolute paths or module names)."""
    try:
        plugins.import_all(spec.plugins)
    except plugins.PluginError as e:
        raise MEGError(str(e), source=source, field="plugins") from None
    spec = validate(
        spec,
        source=source,
        known_rewards=known_rewards(),
        known_losses=loss_names(),
        known_tools=known_tools(),
        policy_problems=problems,
    )
    check_workload(spec, source)
    return spec


def check_workload(spec: MEGSpec, source: str) -> None:
    """Reward bindings callable with their params; the dataset generator known."""
    for node, binding in spec.rewards.items():
        try:
            check_binding(binding.fn, binding.params)
        except TypeError as e:
            raise MEGError(str(e), source=source, field=f"rewards.{node}.params") from None
    for name, agent in spec.agents.items():
        problem = skip_zero_advantage_problem(agent.loss)
        if problem:
            raise MEGError(problem, source=source, field=f"agents.{name}.loss.skip_zero_advantage")
    if spec.dataset.generator is not None:
        try:
            GENERATORS.get(spec.dataset.generator)
        except KeyError as e:
            raise MEGError(str(e), source=source, field="dataset.generator") from None


def skip_zero_advantage_problem(loss: LossSpec) -> str | None:
    """Why `skip_zero_advantage: true` would not be exact for this loss (None: it is)."""
    if not loss.skip_zero_advantage:
        return None
    if loss.kl_coef:
        return (
            "skip_zero_advantage needs kl_coef 0: the KL term gives a zero-advantage "
            "sequence a gradient"
        )
    if not zero_at_zero_advantage(loss.policy_loss):
        return (
            f"skip_zero_advantage: policy loss {loss.policy_loss!r} is not registered as zero "
            "at zero advantage (@register_policy_loss(name, zero_at_zero_advantage=True))"
        )
    return None


def model_dir(agent: str, model: str, source: str) -> Path | None:
    """The local directory of an agent's model for the driver's checks: a URL is fetched
    into the model cache (engines.model_files); None for a hub name (not fetched here)."""
    from engines.model_files import ModelFetchError, local_dir

    if is_hub_name(model):
        return None
    try:
        return Path(local_dir(model)).expanduser()
    except ModelFetchError as e:
        raise MEGError(str(e), source=source, field=f"agents.{agent}.model") from None


def check_lora(spec: MEGSpec, source: str) -> None:
    """Every LoRA agent's targets exist in its model, and its engine can serve adapters.

    Local models only (a hub model is checked where it is downloaded: on the workers). The
    one driver check that needs torch: peft counts the adapter on a weightless (meta) model,
    so a MEG without LoRA agents never imports it here."""
    if all(agent.lora is None for agent in spec.agents.values()):
        return
    from engines.training.lora import LoraConfig, adapter_parameters

    for name, agent in spec.agents.items():
        lora = LoraConfig.from_json(None if agent.lora is None else agent.lora.model_dump())
        local = model_dir(name, agent.model, source)
        if lora is None or local is None:
            continue
        try:
            adapter_parameters(str(local), lora)
        except ValueError as e:
            raise MEGError(
                str(e), source=source, field=f"agents.{name}.lora.target_modules"
            ) from None
        if agent.backend == "vllm":
            from engines.rollout.vllm_support import lora_architecture_problem

            problem = lora_architecture_problem(local)
            if problem:
                raise MEGError(problem, source=source, field=f"agents.{name}.backend")
