"""The consistency audit reads only the store, and catches every kind of violation."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.audit import audit_consistency
from storage.schema import SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch


def _log(
    store: MEGStore,
    agent: str,
    step: int,
    row_versions: list[int],
    before: int,
    mode: str,
    staleness: int = 0,
) -> None:
    table = store.table(agent)
    ids = []
    for j, v in enumerate(row_versions):
        key = SegmentKey(step, j, "solve")
        ids.append(
            table.write_segment(
                key, synthetic_batch(key, groups=1, group_size=2, version=v)
            ).segment_id
        )
    table.record_consumption(
        step,
        ids,
        row_versions,
        extra={"version_before": before, "mode": mode, "staleness": staleness},
    )


@pytest.mark.parametrize(
    ("mode", "staleness", "row_versions", "before", "violations"),
    [
        ("flex", 0, [3, 3], 3, 0),  # on-policy
        ("flex", 0, [2, 3], 3, 2),  # one stale segment (2 rows)
        ("sync", 0, [4, 3], 3, 2),  # rows from a future policy
        ("async", 1, [2, 3], 3, 0),  # within η
        ("async", 1, [1, 3], 3, 2),  # older than η
    ],
)
def test_audit_counts_rows_outside_the_allowed_versions(
    tmp_path: Path,
    mode: str,
    staleness: int,
    row_versions: list[int],
    before: int,
    violations: int,
) -> None:
    store = MEGStore.open(str(tmp_path), "run")
    _log(store, "solver", 0, row_versions, before, mode, staleness)
    audit = audit_consistency(store)
    assert audit.rows_checked == 4 and audit.steps_checked == 1
    assert audit.violations == violations
    assert bool(audit.problems) == bool(violations)
    assert audit.max_lag == before - min(row_versions)
