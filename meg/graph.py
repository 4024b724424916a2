"""Graph algorithms over a MEG: order, cycles, sinks, critical path. Pure functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
