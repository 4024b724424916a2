"""Checks of a MEG's sizes against the limits of `meg.limits`, with the numbers that explain
a refusal (samples per step, a prompt's worst case against its model's context)."""

from __future__ import annotations

from meg.expand import expand_episode
from meg.fanout import PER_SAMPLE
from meg.graph import topological_order
from meg.limits import MAX_STEP_SAMPLES
from meg.spec import MEGSpec


def episode_samples(spec: MEGSpec) -> dict[str, int]:
    """Samples of each node in one episode, counted without expanding it: a node with a
    `per_sample` driver is invoked once per driver sample, any other node once; each
    invocation makes `n` samples. Equal to `expand_episode`'s counts (tested)."""
    out: dict[str, int] = {}
    for name in topological_order(spec):
        node = spec.nodes[name]
        drivers = [p for p, rule in node.inputs.items() if rule == PER_SAMPLE]
        out[name] = (out[drivers[0]] if drivers else 1) * node.n
    return out


def step_samples_problem(spec: MEGSpec, episodes_per_step: int) -> str | None:
    """Why a step of `episodes_per_step` episodes is too big (None: it is not)."""
    per_node = episode_samples(spec)
    total = episodes_per_step * sum(per_node.values())
    if total <= MAX_STEP_SAMPLES:
        return None
    top = sorted(per_node.items(), key=lambda kv: -kv[1])[:3]
    shown = ", ".join(f"{name} {count:,}" for name, count in top)
    return (
        f"one step would generate {total:,} samples ({episodes_per_step:,} episodes × "
        f"{sum(per_node.values()):,} samples each; most from {shown}); the limit is "
        f"{MAX_STEP_SAMPLES:,}: lower episodes_per_step or the nodes' n, or use more steps"
    )


def context_problems(spec: MEGSpec, contexts: dict[str, int]) -> list[tuple[str, str]]:
    """(field, why) for each node whose prompt can outgrow its model's context.

    `contexts` maps an agent to its model's context length (agents missing: unknown, not
    checked). A node's prompt shows its inputs' samples, each up to the producing node's
    `max_tokens` (what its own context leaves, at most), plus the question (its
    `question_tokens` estimate); when that alone reaches the node's context, a long enough
    sample makes the rollout fail mid-run (`PromptTooLongError`). The template's own text
    is not counted, so a refusal here is certain to be needed, never a guess.
    """

    def longest(node: str) -> int:
        own = spec.node_max_tokens(node)
        limit = contexts.get(spec.nodes[node].agent)
        return own if limit is None else min(own, limit - 1)

    problems = []
    for name, plans in expand_episode(spec).invocations.items():
        limit = contexts.get(spec.nodes[name].agent)
        if limit is None or not plans:
            continue
        worst = max(plans, key=lambda p: sum(len(s) * longest(q) for q, s in p.inputs))
        shown = [(q, len(s)) for q, s in worst.inputs if s]
        need = spec.dataset.question_tokens + sum(k * longest(q) for q, k in shown)
        if shown and need >= limit:
            parts = ", ".join(f"{q}: {k} × {longest(q):,}" for q, k in shown)
            problems.append(
                (
                    f"nodes.{name}.inputs",
                    f"the prompt can reach {need:,} tokens (question ~"
                    f"{spec.dataset.question_tokens}, shown samples × their max_tokens: "
                    f"{parts}), but agent {spec.nodes[name].agent!r} has a {limit:,}-token "
                    "context; lower the shown nodes' max_tokens, or show fewer samples",
                )
            )
    return problems
