"""Graph algorithms over a MEG: order, cycles, sinks, critical path, score groups. Pure
functions."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from meg.spec import MEGSpec


def edges(spec: MEGSpec) -> list[tuple[str, str, str]]:
    """(parent, child, fan-out rule) for every input of every node, in declaration order."""
    return [(p, n, rule) for n, node in spec.nodes.items() for p, rule in node.inputs.items()]


def find_cycle(children: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle as a closed path [a, b, ..., a], or None. Iterative DFS (no recursion limit)."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in children:
        if state.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        state[root] = 1
        while stack:
            node, i = stack[-1]
            kids = children.get(node, ())
            if i < len(kids):
                stack[-1] = (node, i + 1)
                kid = kids[i]
                if state.get(kid) == 1:
                    return [*path[path.index(kid) :], kid]
                if not state.get(kid):
                    state[kid] = 1
                    stack.append((kid, 0))
                    path.append(kid)
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    return None


def children_map(spec: MEGSpec) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {n: [] for n in spec.nodes}
    for p, c, _ in edges(spec):
        if p in out:
            out[p].append(c)
    return out


def topological_order(spec: MEGSpec) -> list[str]:
    """Kahn's algorithm; ties keep declaration order so the output is stable."""
    indeg = {n: len(node.inputs) for n, node in spec.nodes.items()}
    kids = children_map(spec)
    ready = [n for n in spec.nodes if indeg[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for c in kids[n]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if len(order) != len(spec.nodes):
        raise ValueError(f"graph has a cycle: {' -> '.join(find_cycle(kids) or [])}")
    return order


def sinks(spec: MEGSpec) -> list[str]:
    kids = children_map(spec)
    return [n for n in spec.nodes if not kids[n]]


def critical_path(spec: MEGSpec, weight: Mapping[str, float]) -> tuple[list[str], float]:
    """Heaviest root-to-sink path where each node costs `weight[node]` (e.g. decode tokens).

    Decode is sequential per sample, so with unlimited parallelism an episode cannot finish
    faster than the sum of `max_tokens` along this path.
    """
    best: dict[str, tuple[float, str | None]] = {}
    for n in topological_order(spec):
        parents = list(spec.nodes[n].inputs)
        prev = max(parents, key=lambda p: best[p][0]) if parents else None
        base = best[prev][0] if prev else 0.0
        best[n] = (base + weight[n], prev)
    end = max(best, key=lambda n: best[n][0])
    path: list[str] = []
    cur: str | None = end
    while cur is not None:
        path.append(cur)
        cur = best[cur][1]
    return path[::-1], best[end][0]


def ancestors(spec: MEGSpec, nodes: Collection[str]) -> set[str]:
    """Every node upstream of `nodes` (through inputs), excluding `nodes` themselves unless
    one is upstream of another."""
    seen: set[str] = set()
    todo = [p for n in nodes for p in spec.nodes[n].inputs]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(spec.nodes[n].inputs)
    return seen


@dataclass(frozen=True, slots=True)
class ScoreGroup:
    """Nodes scored by one task: `waits` must be generated first (the latest nodes it
    reads), `loads` are the nodes whose samples its rewards see."""

    nodes: tuple[str, ...]
    waits: tuple[str, ...]
    loads: tuple[str, ...]


def score_groups(
    spec: MEGSpec, reads: Mapping[str, Collection[str] | None]
) -> tuple[ScoreGroup, ...]:
    """Partition the nodes by when they can be scored.

    `reads[node]`: the other nodes its reward looks at (None: the whole episode; a node
    missing from `reads` reads nothing). A node can be scored once it and what it reads are
    generated; its reward sees its own node, what it reads, and everything upstream of what
    it reads (a team reward follows lineage through the nodes between). Nodes that wait for
    the same nodes share a task. Groups come in the order they become ready (topological order
    of their last awaited node)."""
    order = topological_order(spec)
    pos = {n: i for i, n in enumerate(order)}
    groups: dict[tuple[str, ...], list[str]] = {}
    loads: dict[tuple[str, ...], set[str]] = {}
    for node in order:
        if spec.nodes[node].is_tool:  # scored where it runs (its tool's own reward)
            continue
        read = reads.get(node, ())
        if read is None:
            read = spec.nodes
        unknown = sorted(set(read) - set(spec.nodes))
        if unknown:
            raise ValueError(
                f"the reward of node {node!r} reads {', '.join(map(repr, unknown))}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not in the graph; nodes: "
                f"{', '.join(spec.nodes)}"
            )
        need = {node, *read}
        waits = tuple(sorted(need - ancestors(spec, need), key=pos.__getitem__))
        groups.setdefault(waits, []).append(node)
        loads.setdefault(waits, set()).update(need | ancestors(spec, read))
    return tuple(
        ScoreGroup(tuple(nodes), waits, tuple(sorted(loads[waits], key=pos.__getitem__)))
        for waits, nodes in sorted(groups.items(), key=lambda kv: pos[kv[0][-1]])
    )
