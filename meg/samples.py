"""One sample as episode planning sees it: its id, node, lineage and ranking score.

Shared by the fan-out rules (`meg.fanout`, which pick among samples) and episode expansion
(`meg.expand`, which makes them), below both.
"""

from __future__ import annotations

from dataclasses import dataclass

Lineage = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SampleInfo:
    id: str
    node: str
    lineage: Lineage
    score: float = 0.0
