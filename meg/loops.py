"""Unroll bounded loops into plain nodes, and fill in the agent of tool nodes.

A loop of R rounds over body nodes B becomes nodes `{b}@{r}`. Inside round r a body name
means round r's node; in the `again` node of round r > 1 it means round r-1's (the code to
repair, the test output that says why). Round r > 1 starts only where none of `until` held
on round r-1: its `again` node gets `when:` the negated conditions, and everything else of
the round descends from it, so an invocation that does not run skips its whole subtree
(`tasks.rollout` stores those rows as `skipped`). The graph stays a static DAG: the task
graph, the balancer and the async modes see an ordinary MEG whose later rounds may be empty.

Rewards and `team_nodes` may name a body node: they then apply to each of its rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from meg.agentic_spec import LoopSpec, TurnOf, WhenSpec
from meg.conditions import params_problem
from meg.expand import driver_of
from meg.spec import MEGSpec, NodeSpec, RewardSpec
from meg.template import PLACEHOLDER, RESERVED


def round_name(body: str, r: int) -> str:
    return f"{body}@{r}"


def rename_placeholders(text: str, names: Mapping[str, str]) -> str:
    """`text` with each `{old}` placeholder in `names` written `{new}`; other placeholders
    and literal `{{`/`}}` as they were."""
    return PLACEHOLDER.sub(lambda m: "{" + names.get(m.group(1), m.group(1)) + "}", text)


class LoopError(ValueError):
    """A loop that cannot be unrolled; `field` is where, under `loops.<name>`."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _entry(name: str, loop: LoopSpec) -> str:
    if len(loop.again) != 1:
        raise LoopError(
            f"`again` names {len(loop.again)} nodes; a round re-enters at exactly one body node",
            f"loops.{name}.again",
        )
    entry = next(iter(loop.again))
    if entry not in loop.body:
        raise LoopError(
            f"`again` names {entry!r}, which is not a body node ({', '.join(loop.body)})",
            f"loops.{name}.again",
        )
    return entry


def _round_node(
    raw: Mapping[str, Any], names: Mapping[str, str], turn: TurnOf, gate: list[WhenSpec]
) -> NodeSpec:
    """One round's node from its body entry (raises LoopError naming the field)."""
    where = f"loops.{turn.loop}.{'again' if gate else 'body'}.{turn.body}"
    if not isinstance(raw, Mapping):
        raise LoopError(f"a body node is a mapping of node fields, got {raw!r}", where)
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, Mapping):
        raise LoopError(f"`inputs` maps input nodes to fan-out rules, got {inputs!r}", where)
    when = raw.get("when", [])
    if not isinstance(when, list):
        raise LoopError(f"`when` is a list of conditions, got {when!r}", where)
    try:
        return _validated(raw, names, turn, gate)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise LoopError(str(err["msg"]), f"{where}.{field}" if field else where) from None


def _validated(
    raw: Mapping[str, Any], names: Mapping[str, str], turn: TurnOf, gate: list[WhenSpec]
) -> NodeSpec:
    node = dict(raw)
    node["inputs"] = {names.get(p, p): rule for p, rule in dict(raw.get("inputs", {})).items()}
    if isinstance(node.get("template"), str):
        node["template"] = rename_placeholders(node["template"], names)
    chat = node.get("chat")
    if isinstance(chat, dict) and isinstance(chat.get("user"), str):
        node["chat"] = {**chat, "user": rename_placeholders(chat["user"], names)}
    own = [  # renamed as written, validated with the node (errors name `when.<i>`)
        {**w, "node": names.get(w["node"], w["node"])}
        if isinstance(w, dict) and isinstance(w.get("node"), str)
        else w
        for w in raw.get("when", [])
    ]
    node["when"] = own + [g.model_dump() for g in gate]
    node["turn"] = turn
    return NodeSpec.model_validate(node)


def unroll_loop(name: str, loop: LoopSpec) -> dict[str, NodeSpec]:
    """The nodes of loop `name`, round by round (raises `LoopError`, or pydantic's
    `ValidationError` for a body node that is not a valid node)."""
    entry = _entry(name, loop)
    for body in loop.body:
        if body in RESERVED:
            raise LoopError(
                f"body node {body!r}: `{{{body}}}` is a reserved placeholder; rename the node",
                f"loops.{name}.body.{body}",
            )
        if "@" in body:
            raise LoopError(
                f"body node {body!r}: names inside a loop may not contain `@` (rounds add it)",
                f"loops.{name}.body.{body}",
            )
    for i, cond in enumerate(loop.until):
        try:
            problem = params_problem(cond.fn, cond.params)
        except KeyError as e:  # an unknown condition: the registry's message lists them
            raise LoopError(str(e), f"loops.{name}.until.{i}.fn") from None
        if problem:
            raise LoopError(problem, f"loops.{name}.until.{i}.params")
        if cond.node not in loop.body:
            raise LoopError(
                f"`until` reads {cond.node!r}, which is not a body node ({', '.join(loop.body)})",
                f"loops.{name}.until.{i}.node",
            )
    again = {**loop.body[entry], **loop.again[entry]}
    chat = again.get("chat")
    if "template" in loop.again[entry] and isinstance(chat, dict) and "user" in chat:
        # the override's template is the prompt (written once, in `again`)
        again["chat"] = {k: v for k, v in chat.items() if k != "user"}
    if not isinstance(again.get("inputs", {}), Mapping):
        raise LoopError(
            f"`inputs` maps input nodes to fan-out rules, got {again['inputs']!r}",
            f"loops.{name}.again.{entry}.inputs",
        )
    shown = set(again.get("inputs", {}))
    for i, cond in enumerate(loop.until):
        if cond.node not in shown:
            raise LoopError(
                f"`until` reads {cond.node!r} of the previous round, which `again.{entry}` does "
                f"not take as an input; add `{cond.node}: first` (or per_sample) to its inputs",
                f"loops.{name}.until.{i}.node",
            )
    out: dict[str, NodeSpec] = {}
    for r in range(1, loop.rounds + 1):
        this = {b: round_name(b, r) for b in loop.body}
        for body, raw in loop.body.items():
            turn = TurnOf(loop=name, body=body, round=r, entry=entry)
            if r > 1 and body == entry:
                prev = {b: round_name(b, r - 1) for b in loop.body}
                gate = [
                    c.model_copy(update={"node": prev[c.node], "negate": not c.negate})
                    for c in loop.until
                ]
                out[this[body]] = _round_node(again, prev, turn, gate)
            else:
                out[this[body]] = _round_node(raw, this, turn, [])
    _check_gated(name, loop, entry, out)
    return out


def _check_gated(name: str, loop: LoopSpec, entry: str, nodes: Mapping[str, NodeSpec]) -> None:
    """Every node of a later round must descend from its entry, or it would run (and
    train) in a round the loop did not take."""
    if loop.rounds < 2:
        return
    round2 = {n: s for n, s in nodes.items() if s.turn is not None and s.turn.round == 2}
    reached = {round_name(entry, 2)}
    grew = True
    while grew:  # a fixpoint: the body is small
        grew = False
        for n, node in round2.items():
            if n not in reached and any(p in reached for p in node.inputs):
                reached.add(n)
                grew = True
    loose = sorted(round2[n].turn.body for n in round2 if n not in reached)  # type: ignore[union-attr]
    if loose:
        raise LoopError(
            f"body node(s) {', '.join(loose)} do not read the round's entry {entry!r} (directly "
            "or through other body nodes), so a round the loop did not take would still run them",
            f"loops.{name}.body",
        )


def expand_bound(names: list[str], loops: Mapping[str, LoopSpec]) -> list[str]:
    """`names` with each loop body name replaced by all of its rounds."""
    out: list[str] = []
    for n in names:
        rounds = [
            round_name(n, r)
            for loop in loops.values()
            if n in loop.body
            for r in range(1, loop.rounds + 1)
        ]
        out.extend(rounds or [n])
    return out


def expand_rewards(
    rewards: Mapping[str, RewardSpec], loops: Mapping[str, LoopSpec]
) -> dict[str, RewardSpec]:
    """Each reward bound to a body node, bound to every round; a param whose value names a
    body node of that loop (`target: test`) names the same round's (`test@2`)."""
    out: dict[str, RewardSpec] = {}
    for node, spec in rewards.items():
        loop = next((lp for lp in loops.values() if node in lp.body), None)
        if loop is None:
            out[node] = spec
            continue
        for r in range(1, loop.rounds + 1):
            params = {
                k: round_name(v, r) if isinstance(v, str) and v in loop.body else v
                for k, v in spec.params.items()
            }
            out[round_name(node, r)] = spec.model_copy(update={"params": params})
    return out


def fill_tool_agents(nodes: dict[str, NodeSpec]) -> dict[str, NodeSpec]:
    """A tool node without `agent` stores its rows in its driver input's agent's table (the
    agent whose action it answers; the first input where none drives). Repeated until
    nothing changes, so a tool reading a tool inherits through it."""
    out = dict(nodes)
    changed = True
    while changed:
        changed = False
        for name, node in out.items():
            if not (node.is_tool and not node.agent):
                continue
            source = driver_of(node) or next(iter(node.inputs))
            if source in out and out[source].agent:
                out[name] = node.model_copy(update={"agent": out[source].agent})
                changed = True
    return out


def chain_nodes(spec: MEGSpec) -> dict[tuple[str, str], list[str]]:
    """(loop, body) → its round nodes in round order, for body nodes of an agent."""
    chains: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for n, node in spec.nodes.items():
        if node.turn is not None and not node.is_tool:
            chains.setdefault((node.turn.loop, node.turn.body), []).append((node.turn.round, n))
    return {k: [n for _, n in sorted(v)] for k, v in chains.items()}


def loop_nodes(spec: MEGSpec, loop: str) -> list[str]:
    return [n for n, node in spec.nodes.items() if node.turn is not None and node.turn.loop == loop]


def gated(spec: MEGSpec) -> bool:
    """Whether any node of the MEG may be skipped (a condition, or a loop's later round)."""
    return any(node.when for node in spec.nodes.values())
