"""Static load analysis of a MEG: what one episode asks of each agent.

Estimates, not measurements: decode tokens assume every sample runs to `max_tokens` (an upper
bound; the balancer replaces it with measured demand), and prompt tokens are the template's
own text at `chars_per_token` plus `question_tokens` plus every shown parent sample at its
parent's `max_tokens`. Prompts are counted once per invocation: its `n` samples share it.
A tool node (an environment step) has no prompt and decodes nothing: it is listed per node,
not in its agent's calls (its observation text, unknown before it runs, counts 0 tokens
where a child shows it).
"""

from __future__ import annotations

from dataclasses import dataclass

from meg.expand import EpisodeExpansion, expand_episode
from meg.graph import critical_path, topological_order
from meg.spec import MEGSpec
from meg.template import static_text


@dataclass(frozen=True, slots=True)
class NodeLoad:
    node: str
    agent: str
    invocations: int
    samples: int
    prompt_tokens: int
    decode_tokens: int


@dataclass(frozen=True, slots=True)
class AgentLoad:
    agent: str
    calls: int
    samples: int
    prompt_tokens: int
    decode_tokens: int


@dataclass(frozen=True, slots=True)
class Analysis:
    order: tuple[str, ...]
    nodes: tuple[NodeLoad, ...]
    agents: tuple[AgentLoad, ...]
    critical_path: tuple[str, ...]
    critical_decode_tokens: float
    expansion: EpisodeExpansion


def analyze(spec: MEGSpec, *, chars_per_token: float = 3.0) -> Analysis:
    order = topological_order(spec)
    exp = expand_episode(spec)
    nodes = []
    for name in order:
        node = spec.nodes[name]
        prompts = prompt_tokens(spec, name, exp, chars_per_token)
        prompt = sum(prompts)
        samples = len(exp.samples[name])
        nodes.append(
            NodeLoad(
                name,
                node.agent,
                len(exp.invocations[name]),
                samples,
                prompt,
                samples * spec.node_max_tokens(name),
            )
        )
    agents = []
    for a in spec.agents:
        mine = [n for n in nodes if n.agent == a and not spec.nodes[n.node].is_tool]
        agents.append(
            AgentLoad(
                a,
                sum(n.invocations for n in mine),
                sum(n.samples for n in mine),
                sum(n.prompt_tokens for n in mine),
                sum(n.decode_tokens for n in mine),
            )
        )
    path, cost = critical_path(spec, {n: float(spec.node_max_tokens(n)) for n in spec.nodes})
    return Analysis(tuple(order), tuple(nodes), tuple(agents), tuple(path), cost, exp)


def prompt_tokens(
    spec: MEGSpec, node: str, exp: EpisodeExpansion, chars_per_token: float = 3.0
) -> list[int]:
    """The estimated prompt of each of `node`'s invocations in the episode `exp`: the
    template's own text, the question, and every shown sample at its node's `max_tokens`.
    A tool node has none."""
    spec_node = spec.nodes[node]
    if spec_node.is_tool:
        return []
    own = round(len(static_text(spec_node.template)) / chars_per_token)
    return [
        own
        + spec.dataset.question_tokens
        + sum(len(s) * spec.node_max_tokens(p) for p, s in plan.inputs)
        for plan in exp.invocations[node]
    ]


def longest_rows(spec: MEGSpec, chars_per_token: float = 3.0) -> dict[str, tuple[int, int]]:
    """Per LLM node: (its samples in one episode, the tokens its longest sample can hold:
    the longest prompt plus the node's `max_tokens`). What a rollout engine's KV cache
    must hold for the node's rows (`engines.kv_cache`)."""
    exp = expand_episode(spec)
    out = {}
    for name in topological_order(spec):
        prompts = prompt_tokens(spec, name, exp, chars_per_token)
        if prompts:
            out[name] = (len(exp.samples[name]), max(prompts) + spec.node_max_tokens(name))
    return out
