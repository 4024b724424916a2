"""Load a MEG from YAML and validate it, with errors that name the file and the field.

`load_meg` is the one entry point: parse YAML (rejecting duplicate keys, which plain YAML
silently overwrites), build the pydantic spec, unroll exchanges into nodes, then check the
cross-field rules. Registries of other layers (reward functions, fan-out rules) are passed in
by the caller, so `meg` imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from meg.agentic_checks import check_agentic
from meg.errors import MEGError
from meg.fanout import PER_SAMPLE, known_fanouts
from meg.graph import children_map, find_cycle
from meg.limits import MAX_NODES
from meg.registry import Registry
from meg.sizes import step_samples_problem
from meg.spec import NAME, MEGSpec
from meg.template import RESERVED, placeholders
from meg.unroll import unroll_exchanges, unroll_loops

HUB_PREFIX = "hf://"


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise MEGError(
                f"duplicate name {key!r} (line {key_node.start_mark.line + 1}); "
                "every agent, node and key must be unique"
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str = "<memory>") -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except MEGError as e:
        raise MEGError(e.detail, source=source) from None
    except yaml.YAMLError as e:
        raise MEGError(f"not valid YAML: {e}", source=source) from None
    if not isinstance(data, dict):
        raise MEGError(
            "a MEG config must be a YAML mapping with `agents` and `nodes`", source=source
        )
    return data


def build_spec(data: dict[str, Any], source: str = "<memory>") -> MEGSpec:
    """Pydantic validation, then exchange unrolling. Raises MEGError on the first problem."""
    try:
        spec = MEGSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        more = f" (and {len(e.errors()) - 1} more problem(s))" if len(e.errors()) > 1 else ""
        raise MEGError(f"{err['msg']}{more}", source=source, field=field) from None
    spec = unroll_exchanges(spec, source)
    return unroll_loops(spec, source)


def is_hub_name(model: str) -> bool:
    return model.startswith(HUB_PREFIX)


def is_url(model: str) -> bool:
    """A model named by an fsspec URL (`s3://bucket/models/x`), not a local path."""
    return "://" in model and not model.startswith(("file://", HUB_PREFIX))


# (spec, the reward registry or None) → [(field, problem)]: `policies.problems`
PolicyProblems = Callable[[MEGSpec, Any], list[tuple[str, str]]]


def validate(
    spec: MEGSpec,
    *,
    source: str = "<memory>",
    known_rewards: Collection[str] | Registry[Any] | None = None,
    known_losses: Mapping[str, Collection[str]] | None = None,
    known_tools: Registry[Any] | None = None,
    policy_problems: PolicyProblems | None = None,
    check_models: bool = True,
) -> MEGSpec:
    """Cross-field rules. `known_rewards=None` skips the reward-name check; `known_losses`
    maps a `LossSpec` field (`advantage`, `policy_loss`, ...) to its registered names;
    `known_tools=None` skips the tool-name check; `policy_problems` (`policies.problems`)
    gives what the run's rollout and selection policies find wrong, None skips them."""

    def fail(msg: str, field: str) -> MEGError:
        return MEGError(msg, source=source, field=field)

    if not spec.nodes:
        raise fail("a MEG needs at least one node (or an exchange)", "nodes")
    for name in [*spec.agents, *spec.nodes]:
        if not NAME.match(name):
            raise fail(f"invalid name {name!r}: use letters, digits, _, - and @", name)
    for name in spec.nodes:
        if name in RESERVED:
            raise fail(
                f"node {name!r}: `{{{name}}}` is a reserved placeholder (the task's text), so a "
                "template could never read this node; rename the node",
                f"nodes.{name}",
            )
    for name, node in spec.nodes.items():
        where = f"nodes.{name}"
        if node.agent not in spec.agents and not (node.is_tool and not node.agent):
            raise fail(
                f"unknown agent {node.agent!r}; known agents: {', '.join(spec.agents)}",
                f"{where}.agent",
            )
        for parent, rule in node.inputs.items():
            if parent not in spec.nodes:
                raise fail(
                    f"unknown input node {parent!r}; known nodes: {', '.join(spec.nodes)}",
                    f"{where}.inputs",
                )
            if rule not in known_fanouts():
                raise fail(
                    f"unknown fan-out rule {rule!r} for input {parent!r}; known rules: "
                    f"{', '.join(known_fanouts())}",
                    f"{where}.inputs.{parent}",
                )
        drivers = [p for p, r in node.inputs.items() if r == PER_SAMPLE]
        if len(drivers) > 1:
            raise fail(
                f"{len(drivers)} inputs are per_sample ({', '.join(drivers)}); at most one input "
                "can drive the fan-out: make the others all, first or best",
                f"{where}.inputs",
            )
        if node.chat is not None and node.chat.system and placeholders(node.chat.system):
            raise fail(
                "the chat system message is fixed text; put placeholders in the user message",
                f"{where}.chat.system",
            )
        for ph in placeholders(node.template):
            if ph not in RESERVED and ph not in node.inputs:
                raise fail(
                    f"template placeholder {{{ph}}} is not an input of this node; its inputs are "
                    f"[{', '.join(node.inputs)}] (and {{question}} is always available)",
                    f"{where}.template",
                )
    cycle = find_cycle(children_map(spec))
    if cycle:
        raise fail(f"the graph has a cycle: {' -> '.join(cycle)}", "nodes")
    if len(spec.nodes) > MAX_NODES:
        raise fail(f"{len(spec.nodes):,} nodes; the limit is {MAX_NODES:,}", "nodes")
    problem = step_samples_problem(spec, spec.run.episodes_per_step)
    if problem:
        raise fail(problem, "run.episodes_per_step")
    for node_name, reward in spec.rewards.items():
        if node_name not in spec.nodes:
            raise fail(
                f"reward bound to unknown node {node_name!r}; known nodes: {', '.join(spec.nodes)}",
                f"rewards.{node_name}",
            )
        if isinstance(known_rewards, Registry):  # resolves `module:attr` names too
            try:
                known_rewards.get(reward.fn)
            except (KeyError, TypeError) as e:
                raise fail(str(e).strip("'\""), f"rewards.{node_name}.fn") from None
        elif known_rewards is not None and reward.fn not in known_rewards:
            raise fail(
                f"unknown reward function {reward.fn!r}; known: {', '.join(sorted(known_rewards))}",
                f"rewards.{node_name}.fn",
            )
    for node_name in spec.team_nodes or []:
        if node_name not in spec.nodes:
            raise fail(f"unknown node {node_name!r}", "team_nodes")
    check_agents(spec, fail, known_losses or {})
    check_agentic(spec, fail, known_tools)
    if policy_problems is not None:  # the rollout and selection policies' own rules
        rewards = known_rewards if isinstance(known_rewards, Registry) else None
        for where, problem in policy_problems(spec, rewards):
            raise fail(problem, where)
    ds = spec.dataset
    if (ds.generator is None) == (ds.url is None):
        raise fail("set exactly one of `generator` (synthetic) or `url` (JSONL/Parquet)", "dataset")
    if check_models:
        for name, agent in spec.agents.items():
            for fld, path in (("model", agent.model), ("tokenizer", agent.tokenizer)):
                if path is None or is_hub_name(path) or is_url(path):
                    continue  # a URL is fetched and checked by who opens it
                if not Path(path).expanduser().is_dir():
                    raise fail(
                        f"model directory {path!r} does not exist (a relative path is looked "
                        "up next to the MEG file, then in the current directory "
                        f"{Path.cwd()}). Build a tiny local model "
                        f"with `flexmarl tiny-model {path} --warm-start {source}` (seeded, "
                        "then warm-started on this MEG's format), or write `hf://ORG/NAME` for a "
                        "Hugging Face hub model",
                        f"agents.{name}.{fld}",
                    )
    return spec


def check_agents(
    spec: MEGSpec, fail: Callable[[str, str], MEGError], known: Mapping[str, Collection[str]]
) -> None:
    """Every agent field is honoured by the engines or rejected here, naming the field."""
    for name, agent in spec.agents.items():
        where = f"agents.{name}"
        for fld, names in known.items():
            value = getattr(agent.loss, fld)
            if value not in names:
                raise fail(
                    f"unknown {fld.replace('_', ' ')} {value!r}; known: {', '.join(sorted(names))}",
                    f"{where}.loss.{fld}",
                )
        loss = agent.loss
        if loss.clip_eps >= 1.0 or (loss.clip_eps_high is not None and loss.clip_eps_high >= 1.0):
            raise fail(
                "clip ranges must be below 1 (the ratio is clipped to [1 - eps, 1 + eps_high]); "
                f"got clip_eps={loss.clip_eps}, clip_eps_high={loss.clip_eps_high}",
                f"{where}.loss",
            )


def load_meg(
    path: str | Path,
    *,
    known_rewards: Collection[str] | Registry[Any] | None = None,
    known_losses: Mapping[str, Collection[str]] | None = None,
    known_tools: Registry[Any] | None = None,
    policy_problems: PolicyProblems | None = None,
    check_models: bool = True,
    prepare: Callable[[MEGSpec, Path], MEGSpec] | None = None,
) -> MEGSpec:
    """Read, build and validate a MEG config file. `prepare(spec, path)` runs between
    building and validating (the caller imports the MEG's plug-ins there)."""
    p = Path(path)
    source = str(p)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise MEGError("no such file", source=source) from None
    except OSError as e:
        raise MEGError(f"cannot read: {e.strerror}", source=source) from None
    spec = build_spec(parse_yaml(text, source), source)
    if prepare is not None:
        spec = prepare(spec, p)
    return validate(
        spec,
        source=source,
        known_rewards=known_rewards,
        known_losses=known_losses,
        known_tools=known_tools,
        policy_problems=policy_problems,
        check_models=check_models,
    )
