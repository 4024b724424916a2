"""Unroll multi-turn exchanges into plain nodes: a debate of R rounds is `len(agents)·R` nodes.

Round 1 of agent `a` is node `a@1` with the exchange's `first_template`. Round r > 1 is node
`a@r` whose `{self}` placeholder becomes `{a@(r-1)}` (a `per_sample` input, so each of its
samples continues its own thread) and whose `{other}` becomes the other agents' previous turns
(inputs with `other_fanout`, joined by blank lines). Downstream nodes refer to the last round by
name, e.g. a judge with inputs `{alice@2: first, bob@2: first}`.

An exchange may follow upstream nodes (`inputs:`): round 1 shows them under their own rules,
later rounds as `later_rule` says (see `ExchangeSpec`).
"""

from __future__ import annotations

from meg.fanout import PER_SAMPLE
from meg.spec import ExchangeSpec, NodeSpec


def turn_name(agent: str, round_: int) -> str:
    return f"{agent}@{round_}"


def later_rule(rule: str) -> str:
    """How a turn after the first shows an exchange input: `per_sample` becomes `first` of
    the thread's own lineage (the upstream sample the thread already descends from)."""
    return "first" if rule == PER_SAMPLE else rule


def unroll_exchange(ex: ExchangeSpec) -> dict[str, NodeSpec]:
    nodes: dict[str, NodeSpec] = {}
    chat = ex.chat.model_dump() if ex.chat is not None else None
    for r in range(1, ex.rounds + 1):
        for agent in ex.agents:
            name = turn_name(agent, r)
            if r == 1:
                nodes[name] = NodeSpec(
                    agent=agent,
                    template=ex.first_template,
                    n=ex.n,
                    max_tokens=ex.max_tokens,
                    inputs=dict(ex.inputs),
                    chat=chat,
                )
                continue
            own = turn_name(agent, r - 1)
            others = [turn_name(o, r - 1) for o in ex.agents if o != agent]
            template = ex.reply_template.replace("{self}", "{" + own + "}").replace(
                "{other}", "\n\n".join("{" + o + "}" for o in others)
            )
            inputs = {
                own: PER_SAMPLE,
                **{o: ex.other_fanout for o in others},
                **{up: later_rule(rule) for up, rule in ex.inputs.items()},
            }
            # Every turn samples n continuations per thread (its GRPO group), so an agent's
            # samples grow as n^rounds: keep n·rounds small.
            nodes[name] = NodeSpec(
                agent=agent,
                template=template,
                n=ex.n,
                max_tokens=ex.max_tokens,
                inputs=inputs,
                chat=chat,
            )
    return nodes
