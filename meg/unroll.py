"""Unroll multi-turn exchanges into plain nodes: a debate of R rounds is `len(agents)·R` nodes.

Round 1 of agent `a` is node `a@1` with the exchange's `first_template`. Round r > 1 is node
`a@r` whose `{self}` placeholder becomes `{a@(r-1)}` (a `per_sample` input, so each of its
samples continues its own thread) and whose `{other}` becomes the other agents' previous turns
(inputs with `other_fanout`, joined by blank lines). Downstream nodes refer to the last round by
name, e.g. a judge with inputs `{alice@2: first, bob@2: first}`.

An exchange may follow upstream nodes (`inputs:`): round 1 shows them under their own rules,
later rounds as `later_rule` says (see `ExchangeSpec`).

`unroll_exchanges` and `unroll_loops` are the spec-level steps `meg.load.build_spec` runs
(loops: `meg.loops`), each raising a `MEGError` that names the field.
"""

from __future__ import annotations

from meg.errors import MEGError
from meg.fanout import PER_SAMPLE
from meg.limits import MAX_NODES
from meg.loops import LoopError, expand_bound, expand_rewards, fill_tool_agents, unroll_loop
from meg.spec import ExchangeSpec, MEGSpec, NodeSpec


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


def unroll_loops(spec: MEGSpec, source: str) -> MEGSpec:
    """Loops into nodes (`meg.loops`), rewards and team nodes of body names to every round,
    and tool nodes' agents filled in."""
    nodes = dict(spec.nodes)
    for name, loop in spec.loops.items():
        clash = sorted(set(loop.body) & set(nodes))
        if clash:
            raise MEGError(
                f"body node(s) {', '.join(clash)} are also top-level nodes; rewards naming "
                "them would be ambiguous: rename one",
                source=source,
                field=f"loops.{name}.body",
            )
        try:
            unrolled = unroll_loop(name, loop)
        except LoopError as e:
            raise MEGError(str(e), source=source, field=e.field) from None
        for n in unrolled:
            if n in nodes:
                raise MEGError(
                    f"duplicate node name {n!r}: loop {name!r} unrolls into it and it is "
                    "already defined",
                    source=source,
                    field=f"loops.{name}",
                )
        nodes.update(unrolled)
    if len(nodes) > MAX_NODES:
        raise MEGError(
            f"the loops unroll into {len(nodes):,} nodes; the limit is {MAX_NODES:,}",
            source=source,
            field="loops",
        )
    team = spec.team_nodes
    return spec.model_copy(
        update={
            "nodes": fill_tool_agents(nodes),
            "loops": {},
            "rewards": expand_rewards(spec.rewards, spec.loops),
            "team_nodes": None if team is None else expand_bound(team, spec.loops),
        }
    )


def unroll_exchanges(spec: MEGSpec, source: str) -> MEGSpec:
    """Exchanges into nodes (`unroll_exchange`), each checked against the graph around it."""
    if not spec.exchanges:
        return spec
    nodes = dict(spec.nodes)
    unrolled = len(nodes) + sum(len(ex.agents) * ex.rounds for ex in spec.exchanges.values())
    if unrolled > MAX_NODES:
        raise MEGError(
            f"the exchanges unroll into {unrolled:,} nodes (agents × rounds each, plus the "
            f"other nodes); the limit is {MAX_NODES:,}",
            source=source,
            field="exchanges",
        )
    for ex_name, ex in spec.exchanges.items():
        for agent in ex.agents:
            if agent not in spec.agents:
                raise MEGError(
                    f"unknown agent {agent!r}; known agents: {', '.join(spec.agents)}",
                    source=source,
                    field=f"exchanges.{ex_name}.agents",
                )
        if ex.chat is not None and ex.chat.user is not None:
            raise MEGError(
                "an exchange's user messages are its first_template and reply_template; "
                "give `chat` only a `system` message",
                source=source,
                field=f"exchanges.{ex_name}.chat.user",
            )
        for name, node in unroll_exchange(ex).items():
            if name in nodes:
                raise MEGError(
                    f"duplicate node name {name!r}: exchange {ex_name!r} unrolls into it and it "
                    "is already defined",
                    source=source,
                    field=f"exchanges.{ex_name}",
                )
            nodes[name] = node
    for ex_name, ex in spec.exchanges.items():
        for up in ex.inputs:
            if up not in nodes or up in _turns(ex):
                raise MEGError(
                    f"unknown input node {up!r} (an exchange follows nodes outside itself); "
                    f"known nodes: {', '.join(n for n in nodes if n not in _turns(ex))}",
                    source=source,
                    field=f"exchanges.{ex_name}.inputs",
                )
    return spec.model_copy(update={"nodes": nodes, "exchanges": {}})


def _turns(ex: ExchangeSpec) -> set[str]:
    return {f"{a}@{r}" for a in ex.agents for r in range(1, ex.rounds + 1)}
