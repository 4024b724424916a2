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
        own = round(len(static_text(node.template)) / chars_per_token)
        prompt = 0
        for plan in [] if node.is_tool else exp.invocations[name]:  # a tool has no prompt
            shown = sum(len(s) * spec.node_max_tokens(p) for p, s in plan.inputs)
            prompt += own + spec.dataset.question_tokens + shown
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
