"""Cursor: "the next ready micro-batch of whole groups" of one agent's step.

A micro-batch j of step k is ready when every expected node has a committed rows segment
for (k, j) and — unless ``require_scores=False`` — a score segment for (k, j) exists and
gives every row a finite reward and advantage. Groups never span micro-batches (a group is
one node invocation, written in one segment), so a ready micro-batch holds whole groups.
Micro-batches are handed out in the order they become ready, not in index order: that is
what lets a trainer start on j=3 while j=0 is still being scored.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.errors import StoreError
from storage.schema import SampleBatch
from storage.table import Table


@dataclass(frozen=True, slots=True)
class MicroBatch:
    step: int
    micro_batch: int
    segment_ids: tuple[str, ...]  # rows segments the batch was read from
    versions: tuple[int, ...]  # distinct policy versions of its rows
    batch: SampleBatch


class Cursor:
    def __init__(
        self,
        table: Table,
        step: int,
        micro_batches: int,
        *,
        nodes: Sequence[str] | None = None,
        require_scores: bool = True,
    ) -> None:
        if micro_batches < 1:
            raise StoreError(f"micro_batches must be >= 1, got {micro_batches}")
        self.table, self.step, self.micro_batches = table, step, micro_batches
        self.nodes = tuple(nodes) if nodes else None
        self.require_scores = require_scores
        self.taken: dict[int, MicroBatch] = {}

    @property
    def done(self) -> bool:
        return len(self.taken) == self.micro_batches

    def _candidates(self) -> dict[int, list[str]]:
        rows: dict[int, dict[str, str]] = {}
        for info in self.table.segments(step=self.step):
            rows.setdefault(info.micro_batch, {})[info.node] = info.segment_id
        scored = {s.micro_batch for s in self.table.segments(step=self.step, kind="scores")}
        out = {}
        for j in range(self.micro_batches):
            if j in self.taken or j not in rows:
                continue
            if self.nodes and not set(self.nodes) <= set(rows[j]):
                continue
            if self.require_scores and j not in scored:
                continue
            out[j] = sorted(rows[j].values())
        return out

    def poll(self) -> MicroBatch | None:
        """The next ready micro-batch, or None if none is ready now."""
        for j, seg_ids in self._candidates().items():
            batch = self.table.read(segments=seg_ids)
            if self.require_scores and not (
                np.isfinite(batch.reward).all() and np.isfinite(batch.advantage).all()
            ):
                continue  # scores for some rows not written yet
            mb = MicroBatch(
                self.step,
                j,
                tuple(seg_ids),
                batch.own_versions,
                batch,
            )
            self.taken[j] = mb
            return mb
        return None

    def next(self, timeout: float | None = None, poll_s: float = 0.05) -> MicroBatch | None:
        """Block until a micro-batch is ready; None when all are taken or on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if (mb := self.poll()) is not None:
                return mb
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)
        return None

    def record(self, extra: dict[str, Any] | None = None) -> None:
        """Write the consumption log entry for this step from the micro-batches taken."""
        seg_ids = [s for mb in self.taken.values() for s in mb.segment_ids]
        versions = sorted({v for mb in self.taken.values() for v in mb.versions})
        self.table.record_consumption(self.step, seg_ids, versions, extra)
