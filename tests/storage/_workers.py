"""Process entry points for the fault tests (importable, so spawn can start them)."""

from __future__ import annotations

from storage.schema import SegmentKey
from storage.store import MEGStore
from storage.testing import synthetic_batch


def write_many(url: str, worker: int, n_own: int, contended: int) -> list[str]:
    """Write ``n_own`` segments of its own plus ``contended`` keys every worker also writes."""
    table = MEGStore.open(url, "run").table("solver")
    ids = []
    for i in range(n_own):
        key = SegmentKey(worker, i, "solve")
        ids.append(
            table.write_segment(key, synthetic_batch(key, seed=worker * 1000 + i)).segment_id
        )
    for i in range(contended):
        key = SegmentKey(999, i, "race")
        table.write_segment(key, synthetic_batch(key, seed=worker))  # racing "retries"
    return ids


def write_huge(url: str) -> None:
    """One very large segment, so a SIGKILL lands while its columns are being written."""
    table = MEGStore.open(url, "run").table("solver")
    key = SegmentKey(0, 0, "solve")
    table.write_segment(
        key,
        synthetic_batch(
            key, groups=16, group_size=4, prompt_len=20_000, response_len=200_000, ragged=False
        ),
    )


def read_ref(store: MEGStore, ref: object) -> int:
    return len(store.table("solver").read(segments=[ref]))  # type: ignore[list-item]


def open_memory(url: str) -> None:
    MEGStore.open(url, "run", create=False)
