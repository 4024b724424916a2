"""The consistency audit reads only the store, and catches every kind of violation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from storage.audit import Audit, audit_consistency
from storage.schema import SampleBatch, SegmentKey
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


# -- partial rollouts: the token rule with `max_carry` (step 3, version_before 3) -------------

CUT = "k2e0/solve/0/0"  # the sample cut at step 2 and continued at step 3


def _row(
    step: int,
    sid: str,
    response: list[int],
    versions: list[int],
    reason: str,
    version: int | None = None,
) -> Any:
    return {
        "sample_id": sid,
        "group_id": sid.rsplit("/", 1)[0],
        "node": "solve",
        "episode": sid.split("/", 1)[0],
        "step": step,
        "policy_version": max(versions) if version is None else version,
        "prompt_ids": [1, 5, 6],
        "response_ids": response,
        "logprobs": [-0.5] * len(response),
        "token_versions": versions,
        "finish_reason": reason,
    }


def _audit_carried(
    tmp_path: Path,
    row: tuple[list[int], list[int]],
    carries: dict[int, tuple[list[int], list[int]]],
    *,
    max_carry: int = 1,
    mode: str = "flex",
    staleness: int = 0,
    carried_reason: str = "partial",
    version: int | None = None,
) -> Audit:
    """Step 3 trains on sample CUT (`row`) and one fresh on-policy sample; `carries` are the
    carry segments (step → CUT's rows there) committed at earlier steps."""
    table = MEGStore.open(str(tmp_path), "run").table("solver")
    for s, (resp, tv) in carries.items():
        carried = SampleBatch.from_rows([_row(s, CUT, resp, tv, carried_reason)])
        table.write_segment(SegmentKey(s, 0, "solve"), carried, kind="carry")
    rows = [
        _row(3, CUT, *row, "stop", version),
        _row(3, "k3e1/solve/0/0", [40, 41], [3, 3], "stop"),
    ]
    ref = table.write_segment(SegmentKey(3, 0, "solve"), SampleBatch.from_rows(rows))
    extra = {"version_before": 3, "mode": mode, "staleness": staleness, "max_carry": max_carry}
    table.record_consumption(3, [ref.segment_id], list(ref.versions), extra)
    audit = audit_consistency(MEGStore.open(str(tmp_path), "run"))
    assert (audit.rows_checked, audit.steps_checked) == (2, 1)
    assert bool(audit.problems) == bool(audit.violations)
    return audit


PREFIX = ([5, 6, 7], [2, 2, 2])  # CUT as step 2 carried it: 3 tokens of version 2
CONTINUED = ([5, 6, 7, 8, 9], [2, 2, 2, 3, 3])  # ... continued at step 3 by version 3


def test_a_carried_row_proven_by_its_carry_segment_is_clean(tmp_path: Path) -> None:
    audit = _audit_carried(tmp_path, CONTINUED, {2: PREFIX})
    # the row is of version 3, its carried prefix of version 2: the lag counts tokens
    assert audit.violations == 0 and audit.max_lag == 1


def test_a_sample_finished_before_the_cut_is_carried_whole(tmp_path: Path) -> None:
    """A sample that ended at step 2 in an episode that did not: trained at step 3 as it
    was, every token (and the row's policy version) older than the strict bound."""
    audit = _audit_carried(tmp_path, PREFIX, {2: PREFIX}, carried_reason="stop")
    assert audit.violations == 0 and audit.max_lag == 1


@pytest.mark.parametrize(
    ("row", "carries"),
    [
        (CONTINUED, {}),  # stale tokens, never cut: no carry segment
        (PREFIX, {}),  # a whole stale row, never cut
        (([5, 6, 4, 8, 9], [2, 2, 2, 3, 3]), {2: PREFIX}),  # prefix ids differ
        (([5, 6, 7, 8, 9], [2, 2, 3, 3, 3]), {2: PREFIX}),  # prefix versions differ
        (([5, 6, 7, 8, 9], [2, 2, 2, 2, 3]), {2: PREFIX}),  # a stale token after the prefix
        (([5, 6, 7], [2, 2, 2]), {2: ([5, 6, 7, 8], [2, 2, 2, 2])}),  # shorter than the carry
        (CONTINUED, {1: PREFIX}),  # the carry is 2 steps back, max_carry is 1
    ],
)
def test_a_stale_row_not_proven_carried_is_a_violation(
    tmp_path: Path,
    row: tuple[list[int], list[int]],
    carries: dict[int, tuple[list[int], list[int]]],
) -> None:
    audit = _audit_carried(tmp_path, row, carries)
    assert audit.violations == 1
    assert audit.problems[0] == "solver step 3: 1 rows outside versions [2, 3]"


@pytest.mark.parametrize(
    ("row", "carries"),
    [
        (([5, 6, 7, 8, 9], [2, 2, 2, 3, 4]), {2: PREFIX}),  # a token of a future version
        (([40, 41], [4, 4]), {}),  # a whole row of a future version
        (([5, 6, 7, 8, 9], [1, 1, 1, 3, 3]), {2: ([5, 6, 7], [1, 1, 1])}),  # < before - c
    ],
)
def test_tokens_outside_the_widened_bound_are_violations_even_if_carried(
    tmp_path: Path,
    row: tuple[list[int], list[int]],
    carries: dict[int, tuple[list[int], list[int]]],
) -> None:
    assert _audit_carried(tmp_path, row, carries).violations == 1


def test_max_carry_widens_how_far_back_a_carry_may_be(tmp_path: Path) -> None:
    """Cut at step 1, carried through step 2 (a longer prefix), finished at step 3."""
    row = ([5, 6, 7, 8, 9], [1, 1, 2, 3, 3])
    carries = {1: ([5, 6], [1, 1]), 2: ([5, 6, 7], [1, 1, 2])}
    assert _audit_carried(tmp_path / "a", row, carries, max_carry=2).violations == 0
    assert _audit_carried(tmp_path / "b", row, carries, max_carry=1).violations == 1


def test_async_staleness_and_carry_add_up(tmp_path: Path) -> None:
    """async η=1, c=1, before 3: every token in [1, 3]; tokens below 2 must be carried."""
    carried = ([5, 6, 7, 8], [1, 1, 2, 2])
    assert (
        _audit_carried(
            tmp_path / "a", carried, {2: ([5, 6], [1, 1])}, mode="async", staleness=1
        ).violations
        == 0
    )
    assert _audit_carried(tmp_path / "b", carried, {}, mode="async", staleness=1).violations == 1
    stale = ([5, 6], [2, 2])  # within η: no carry needed
    assert _audit_carried(tmp_path / "c", stale, {}, mode="async", staleness=1).violations == 0


@pytest.mark.parametrize(
    ("row", "version", "violations"),
    [
        (([], []), 3, 0),  # an empty response of the current version
        (([], []), 4, 1),  # ... of a future version: no token says so, the row does
        (([40, 41], [3, 3]), 4, 1),  # tokens in bounds, the row of a future version
        (([40, 41], [3, 3]), 1, 1),  # the row older than before - c
    ],
)
def test_the_rows_own_version_is_checked_too(
    tmp_path: Path, row: tuple[list[int], list[int]], version: int, violations: int
) -> None:
    """With `max_carry` as without: a row's policy version outside [before - η - c,
    before] is a violation whatever its token versions say."""
    assert _audit_carried(tmp_path, row, {}, version=version).violations == violations


@pytest.mark.parametrize(("claimed", "violations"), [(-1, 0), (3, 2)])
def test_external_rows_count_as_no_version_and_one_claiming_a_version_is_a_violation(
    tmp_path: Path, claimed: int, violations: int
) -> None:
    """A step's rows from an external policy (`source`) are outside the version rule (a
    frozen model's rows carry no version of the agent) and counted; such a row claiming a
    version of the agent, even the right one, is a violation."""
    store = MEGStore.open(str(tmp_path), "run")
    table = store.table("a")
    key = SegmentKey(0, 0, "solve")
    batch = synthetic_batch(key, groups=2, group_size=4, version=3)
    ext = np.arange(len(batch)) % 4 == 3  # the last row of each group
    n_tok = batch.response_lengths
    versions = np.where(np.repeat(ext, n_tok), claimed, batch.token_versions)
    batch = batch.replace(
        policy_version=np.where(ext, claimed, 3),
        token_versions=versions,
        source=np.where(ext, "model:m", ""),
    )
    sid = table.write_segment(key, batch).segment_id
    assert table.segments()[0].versions == (3,)  # the agent's own versions only
    table.record_consumption(0, [sid], [3], extra={"version_before": 3, "mode": "flex"})
    audit = audit_consistency(store)
    assert (audit.external_rows, audit.violations, audit.max_lag) == (2, violations, 0)
    assert audit.rows_checked == len(batch)
    if violations:
        assert audit.problems == ("a step 0: 2 rows of an external policy claim a version",)
