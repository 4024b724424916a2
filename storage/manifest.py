"""Small JSON objects of the on-disk format: store/table manifests and commit markers.

A commit marker (``commits/<segment id>.json``) is the single source of truth for which
attempt of a segment is visible. It is written last, with an exclusive put, so the first
attempt to commit wins and later attempts of the same key are discarded.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from storage.backends import Backend
from storage.errors import StoreError
from storage.schema import SCHEMA_VERSION, SegmentKey

STORE_FORMAT = "flexmarl-meg-store"
TABLE_FORMAT = "flexmarl-meg-table"
SCORES_SUFFIX = ".scores"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A committed segment as its commit marker describes it."""

    segment_id: str  # "k000003-m0001-solve" (rows) or "k000003-m0001-score.scores"
    kind: str  # "rows" | "scores" | "carry"
    step: int
    micro_batch: int
    node: str
    rows: int
    versions: tuple[int, ...]  # distinct policy versions of the rows (empty for scores)
    attempt: str  # folder under segments/<segment id>/ holding the Zarr group
    committed_at: float


# kind -> suffix of its segment ids; "carry": rows a step cut and handed to the next one
KIND_SUFFIX = {"rows": "", "scores": SCORES_SUFFIX, "carry": ".carry"}


def segment_id_for(key: SegmentKey, kind: str) -> str:
    return key.id + KIND_SUFFIX[kind]


def parse_segment_id(segment_id: str) -> tuple[SegmentKey, str]:
    """Inverse of :func:`segment_id_for`: ``(key, kind)``; ValueError if malformed."""
    for kind, suffix in KIND_SUFFIX.items():
        if suffix and segment_id.endswith(suffix):
            return SegmentKey.parse(segment_id[: -len(suffix)]), kind
    return SegmentKey.parse(segment_id), "rows"


def dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def read_json(backend: Backend, path: str, what: str) -> dict[str, Any]:
    """Parse a JSON object; damaged or absent objects raise StoreError naming the path."""
    raw = backend.read(path)  # FileNotFoundError propagates: callers decide what absent means
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"corrupt {what} at {backend.url_of(path)}: not valid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise StoreError(f"corrupt {what} at {backend.url_of(path)}: expected a JSON object")
    return obj


def check_manifest(backend: Backend, path: str, obj: dict[str, Any], fmt: str) -> None:
    if obj.get("format") != fmt:
        raise StoreError(
            f"{backend.url_of(path)} is not a {fmt} manifest (format={obj.get('format')!r})"
        )
    version = obj.get("schema_version")
    if version != SCHEMA_VERSION:
        raise StoreError(
            f"{backend.url_of(path)} has schema_version {version!r}; this FlexMARL reads "
            f"version {SCHEMA_VERSION} only — open it with the FlexMARL release that wrote it"
        )


def new_manifest(fmt: str, **fields: Any) -> bytes:
    return dumps(
        {"format": fmt, "schema_version": SCHEMA_VERSION, "created_at": time.time(), **fields}
    )


def marker_bytes(info: SegmentInfo) -> bytes:
    return dumps({"schema_version": SCHEMA_VERSION, **asdict(info)})


def parse_marker(backend: Backend, path: str, segment_id: str) -> SegmentInfo:
    obj = read_json(backend, path, "commit marker")
    try:
        if obj.pop("schema_version") != SCHEMA_VERSION:
            raise StoreError(f"commit marker {backend.url_of(path)} has an unknown schema_version")
        info = SegmentInfo(**{**obj, "versions": tuple(int(v) for v in obj["versions"])})
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"corrupt commit marker at {backend.url_of(path)}: {e!r}") from e
    if info.segment_id != segment_id:
        raise StoreError(
            f"corrupt commit marker at {backend.url_of(path)}: it names segment "
            f"{info.segment_id!r}, not {segment_id!r}"
        )
    problem = marker_problem(info)
    if problem:
        raise StoreError(f"corrupt commit marker at {backend.url_of(path)}: {problem}")
    return info


def marker_problem(info: SegmentInfo) -> str | None:
    """What in a marker disagrees with its own segment id or types (None: nothing). A
    damaged field must not pass for a valid one: a flipped byte in `kind` once made a read of
    the segment return no rows instead of an error (found by tests/storage fuzzing)."""
    key, kind = parse_segment_id(info.segment_id)
    said = (info.kind, info.step, info.micro_batch, info.node)
    implied = (kind, key.step, key.micro_batch, key.node)
    if said != implied:
        return f"it describes {said}, its segment id says {implied}"
    if not isinstance(info.rows, int) or isinstance(info.rows, bool) or info.rows < 0:
        return f"rows {info.rows!r} is not a count"
    if not isinstance(info.attempt, str) or not _NAME_RE.match(info.attempt):
        return f"attempt {info.attempt!r} is not a folder name"
    if not isinstance(info.committed_at, (int, float)):
        return f"committed_at {info.committed_at!r} is not a time"
    return None


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise StoreError(f"{kind} {name!r} is not a valid name: use letters, digits, _ . @ -")
    return name


def per_process_message(url: str) -> str:
    return (
        f"{url} is a memory:// store, which lives in one process's memory; it was used from "
        "another process (e.g. a Dask worker). Use a file:// or s3:// store URL to share data "
        "between processes."
    )


def new_attempt_id() -> str:
    return f"a{time.time_ns():x}-{uuid.uuid4().hex[:8]}"
