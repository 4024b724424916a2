"""Render a MEG and its analysis as text (for the terminal) and Mermaid (for Prefect/README)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from meg.analysis import Analysis
from meg.graph import edges
from meg.spec import MEGSpec

_PALETTE = ("#8ecae6", "#ffb703", "#90be6d", "#f4a261", "#cdb4db", "#e76f51", "#a8dadc")


def mermaid(spec: MEGSpec) -> str:
    """A `flowchart` with one colour per agent and the fan-out rule on each edge."""
    ids = {n: f"n{i}" for i, n in enumerate(spec.nodes)}
    lines = ["flowchart TD"]
    for n, node in spec.nodes.items():
        lines.append(f'    {ids[n]}["{n}<br/>{node.agent} ×{node.n}"]')
    for p, c, rule in edges(spec):
        lines.append(f"    {ids[p]} -->|{rule}| {ids[c]}")
    for i, agent in enumerate(spec.agents):
        cls = f"a{i}"
        lines.append(f"    classDef {cls} fill:{_PALETTE[i % len(_PALETTE)]},stroke:#333")
        mine = [ids[n] for n, node in spec.nodes.items() if node.agent == agent]
        if mine:
            lines.append(f"    class {','.join(mine)} {cls}")
    return "\n".join(lines) + "\n"


def text(spec: MEGSpec, analysis: Analysis, width: int = 100) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    con.print(f"MEG {spec.name}: {spec.description}".rstrip(": "))
    con.print("topological order: " + " -> ".join(analysis.order))
    nodes = Table(title="per node, one episode")
    for col in ("node", "agent", "inputs", "invocations", "samples", "prompt tok", "decode tok"):
        nodes.add_column(col, justify="right" if "tok" in col or col[-1] == "s" else "left")
    for nl in analysis.nodes:
        ins = ", ".join(f"{p}:{r}" for p, r in spec.nodes[nl.node].inputs.items()) or "-"
        nodes.add_row(
            nl.node,
            nl.agent,
            ins,
            str(nl.invocations),
            str(nl.samples),
            str(nl.prompt_tokens),
            str(nl.decode_tokens),
        )
    con.print(nodes)
    agents = Table(title="expected load per agent, one episode")
    for col in ("agent", "calls", "samples", "prompt tok", "decode tok"):
        agents.add_column(col, justify="left" if col == "agent" else "right")
    for al in analysis.agents:
        agents.add_row(
            al.agent, str(al.calls), str(al.samples), str(al.prompt_tokens), str(al.decode_tokens)
        )
    con.print(agents)
    con.print(
        "critical path (by decode tokens): "
        + " -> ".join(analysis.critical_path)
        + f"  ({analysis.critical_decode_tokens:.0f} tokens)"
    )
    return buf.getvalue()
