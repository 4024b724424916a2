"""One agent's table: write segments and scores, list committed segments, read rows.

Score segments: segments are immutable, so the scoring task writes rewards/advantages as
a separate segment ``<key id>.scores`` per (step, micro-batch). ``read`` joins them onto
rows by ``sample_id``; unscored rows keep NaN. A sample scored twice with different values
is an error (naming both segments), never a silent pick.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from storage import segments as seg
from storage.backends import Backend
from storage.errors import StoreError, StoreFullError, StoreUnavailableError
from storage.manifest import (
    TABLE_FORMAT,
    SegmentInfo,
    check_manifest,
    dumps,
    marker_bytes,
    new_attempt_id,
    new_manifest,
    parse_marker,
    parse_segment_id,
    per_process_message,
    read_json,
    segment_id_for,
)
from storage.schema import SampleBatch, SegmentKey


class StoreHandle(Protocol):
    """What a table needs of the store that holds it (`storage.store.MEGStore` is one): the
    table sits below the store, which makes and caches its tables."""

    backend: Backend
    run_id: str
    pid: int

    @property
    def url(self) -> str: ...

    def check_process(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Small picklable handle to one committed segment, passed between tasks."""

    url: str
    run_id: str
    agent: str
    segment_id: str
    kind: str  # "rows" | "scores"
    rows: int
    versions: tuple[int, ...]
    pid: int  # writer process; meaningful for memory:// (per-process) only


# Decoded committed segments this process read, by (store, run, agent, segment id, attempt):
# committed segments are immutable, so a second read of one (fanout's three workers read the
# planner's segment, the score tasks what the generates read) decodes nothing again. The
# read path costs ~9 ms of CPU a segment (zarr's event loop) against ~10 µs for a copy out
# of here. Bounded in bytes, least recently used out first; 0 turns it off.
SEGMENT_CACHE_BYTES = 32 * 2**20
_SEGMENTS: OrderedDict[tuple[str, ...], tuple[Any, int]] = OrderedDict()
_SEGMENTS_LOCK = threading.Lock()


def set_segment_cache(nbytes: int) -> None:
    """Bound this process's segment cache at `nbytes` (0: off) and empty it."""
    global SEGMENT_CACHE_BYTES
    with _SEGMENTS_LOCK:
        SEGMENT_CACHE_BYTES = nbytes
        _SEGMENTS.clear()


def _columns_of(value: Any) -> dict[str, np.ndarray]:
    return value.columns() if isinstance(value, SampleBatch) else dict(value)


def _copy(value: Any) -> Any:
    """A fresh copy of a cached rows batch or score columns: callers own what they read."""
    cols = {k: v.copy() for k, v in _columns_of(value).items()}
    return value.replace(**cols) if isinstance(value, SampleBatch) else cols


def _cache_put(key: tuple[str, ...], value: Any) -> None:
    size = sum(int(c.nbytes) for c in _columns_of(value).values())
    if size > SEGMENT_CACHE_BYTES:
        return
    with _SEGMENTS_LOCK:
        _SEGMENTS[key] = (_copy(value), size)
        _SEGMENTS.move_to_end(key)
        while sum(n for _, n in _SEGMENTS.values()) > SEGMENT_CACHE_BYTES:
            _SEGMENTS.popitem(last=False)


def _cache_get(key: tuple[str, ...]) -> Any | None:
    if not SEGMENT_CACHE_BYTES:
        return None
    with _SEGMENTS_LOCK:
        hit = _SEGMENTS.get(key)
        if hit is None:
            return None
        _SEGMENTS.move_to_end(key)
    return _copy(hit[0])


class Table:
    def __init__(self, store: StoreHandle, agent: str) -> None:
        self.store = store
        self.agent = agent
        self.backend = store.backend
        self._infos: dict[str, SegmentInfo] = {}  # committed markers are immutable: cache
        self.last_marker_s = 0.0
        path = self._p("table.json")
        try:
            manifest = read_json(self.backend, path, "table manifest")
        except FileNotFoundError:
            self.backend.put_if_absent(path, new_manifest(TABLE_FORMAT, agent=agent))
            manifest = read_json(self.backend, path, "table manifest")
        check_manifest(self.backend, path, manifest, TABLE_FORMAT)

    def _p(self, *parts: str) -> str:
        return self.backend.join(self.store.run_id, self.agent, *parts)

    def ref(self, info: SegmentInfo) -> SegmentRef:
        s = self.store
        return SegmentRef(
            s.url, s.run_id, self.agent, info.segment_id, info.kind, info.rows, info.versions, s.pid
        )

    # -- writing -------------------------------------------------------------------------
    def write_segment(
        self, key: SegmentKey, batch: SampleBatch, *, kind: str = "rows"
    ) -> SegmentRef:
        """Commit ``batch`` as segment ``key``; a retry of a committed key returns the first.

        ``kind="carry"``: the rows (step, micro-batch) of a node cut before they were done
        and handed to the next step (partial rollouts). They are never part of ``read``; only
        ``read_carry`` returns them."""
        if kind not in ("rows", "carry"):
            raise StoreError(f"row segments are of kind 'rows' or 'carry', got {kind!r}")
        if len(batch) and (np.any(batch.step != key.step) or np.any(batch.node != key.node)):
            raise StoreError(
                f"rows for segment {key.id} must all have step={key.step} and node={key.node!r}"
            )
        versions = batch.own_versions  # an external policy's rows count as no version
        return self._commit(key, kind, len(batch), versions, batch.columns())

    def read_carry(self, key: SegmentKey) -> SampleBatch | None:
        """The rows ``key`` carried to the next step, or None if it committed no carry."""
        info = self.has_segment(key, kind="carry")
        if info is None:
            return None
        return seg.read_many([self._job(info)], "carry")[0]

    def write_scores(
        self,
        key: SegmentKey,
        sample_ids: Any,
        reward: Any,
        advantage: Any,
        status: Any = None,
    ) -> SegmentRef:
        """Commit the score segment of `key`. `status` per row: "ok" (the default), "failed:
        <why>" or "dropped: <why>" (see `tasks.scoring`); reward/advantage as computed."""
        ids = np.asarray(sample_ids, dtype=np.str_).reshape(-1)
        r = np.asarray(reward, dtype=np.float32).reshape(-1)
        a = np.asarray(advantage, dtype=np.float32).reshape(-1)
        st = np.full(len(ids), "ok") if status is None else np.asarray(status, np.str_)
        if not (len(ids) == len(r) == len(a) == len(st.reshape(-1))):
            raise StoreError(
                f"scores for {key.id}: sample_ids ({len(ids)}), reward ({len(r)}), "
                f"advantage ({len(a)}) and status ({st.size}) must have the same length"
            )
        if len(np.unique(ids)) != len(ids):
            raise StoreError(f"scores for {key.id}: sample_ids must be unique")
        cols = {"sample_id": ids, "reward": r, "advantage": a, "status": st.reshape(-1)}
        return self._commit(key, "scores", len(ids), (), cols)

    def _commit(
        self,
        key: SegmentKey,
        kind: str,
        rows: int,
        versions: tuple[int, ...],
        columns: dict[str, np.ndarray],
    ) -> SegmentRef:
        self.store.check_process()
        sid = segment_id_for(key, kind)
        if (done := self._maybe_info(sid)) is not None:
            return self.ref(done)
        attempt = new_attempt_id()
        folder = self._p("segments", sid, attempt)
        attrs = {"segment_id": sid, "attempt": attempt, "kind": kind}
        files = seg.encode(columns, kind, attrs)
        try:
            self.backend.put_files(folder, files)  # all data, then the marker
        except StoreUnavailableError:
            raise  # the server is away: its stalled requests may still land, nothing to undo
        except Exception:
            with suppress(OSError, StoreError):  # best effort: never hide the real error
                self.backend.rm_tree(folder)  # e.g. a full disk: give back what the attempt took
            raise
        t0 = time.perf_counter()
        info = SegmentInfo(
            sid, kind, key.step, key.micro_batch, key.node, rows, versions, attempt, time.time()
        )
        try:
            won = self.backend.put_if_absent(self._p("commits", sid + ".json"), marker_bytes(info))
        except StoreFullError:
            with suppress(OSError, StoreError):
                self.backend.rm_tree(folder)  # the marker was never linked: nothing is committed
            raise
        self.last_marker_s = time.perf_counter() - t0  # the commit point itself (benchmarks)
        if won:
            self._infos[sid] = info
            return self.ref(info)
        self.backend.rm_tree(folder)  # another attempt committed first: ours is never visible
        return self.ref(self._info(sid))

    # -- listing -------------------------------------------------------------------------
    def _info(self, sid: str) -> SegmentInfo:
        info = self._maybe_info(sid)
        if info is None:
            path = self.backend.url_of(self._p("commits", sid + ".json"))
            raise StoreError(
                f"segment {sid} of table {self.agent!r} is missing: not committed "
                f"(no marker at {path})"
            )
        return info

    def _maybe_info(self, sid: str) -> SegmentInfo | None:
        if sid in self._infos:
            return self._infos[sid]
        path = self._p("commits", sid + ".json")
        try:
            info = parse_marker(self.backend, path, sid)
        except FileNotFoundError:
            return None
        self._infos[sid] = info
        return info

    def has_segment(self, key: SegmentKey, *, kind: str = "rows") -> SegmentInfo | None:
        """The committed segment ``key`` (of ``kind``), or None: one small object read, no
        listing — the cheap "already committed by an earlier attempt?" check for a task."""
        self.store.check_process()
        if kind not in ("rows", "scores", "carry"):
            raise StoreError(f"segment kind must be 'rows', 'scores' or 'carry', got {kind!r}")
        return self._maybe_info(segment_id_for(key, kind))

    def segments(
        self,
        *,
        step: int | None = None,
        node: str | None = None,
        micro_batch: int | None = None,
        kind: str = "rows",
    ) -> list[SegmentInfo]:
        """Committed segments matching the filters, sorted by id (step, micro-batch, node).

        With `step`, names are filtered by the step's id prefix before any is parsed: a
        trainer's read lists the score segments of its own step, and parsing every name of
        the table made each read cost more the longer the run (the end-of-run audit of a
        100-step run parsed 240,800 names)."""
        self.store.check_process()
        out = []
        prefix = "" if step is None else SegmentKey.prefix(step, micro_batch)
        for name in self.backend.listdir(self._p("commits")):
            if not name.endswith(".json") or not name.startswith(prefix):
                continue
            sid = name[: -len(".json")]
            try:
                key, k = parse_segment_id(sid)
            except ValueError:
                raise StoreError(
                    f"unexpected file in commits: {self.backend.url_of(self._p('commits', name))}"
                ) from None
            if (
                k != kind
                or (step is not None and key.step != step)
                or (node is not None and key.node != node)
            ):
                continue
            if micro_batch is not None and key.micro_batch != micro_batch:
                continue
            out.append(self._info(sid))
        return out

    # -- reading -------------------------------------------------------------------------
    def read(
        self,
        *,
        step: int | None = None,
        node: str | None = None,
        micro_batch: int | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
        segments: Sequence[str | SegmentRef] | None = None,
    ) -> SampleBatch:
        """Rows of committed segments (filters combine with AND), scores joined on.

        ``segments`` names exact segments (ids or refs); one that is not committed is an error.
        Their rows come in the order of ``segments``, each segment's rows in turn.
        """
        if segments is not None:
            infos = [i for i in (self._info(self._sid(s)) for s in segments) if i.kind == "rows"]
        else:
            infos = self.segments(step=step, node=node, micro_batch=micro_batch)
        batches = self._read_segments(infos, "rows")
        batch = SampleBatch.concat(batches)
        pairs = {(i.step, i.micro_batch) for i in infos}
        steps = {k for k, _ in pairs}
        only = next(iter(steps)) if len(steps) == 1 else step  # segments of one step: its own
        scores = [
            s for s in self.segments(kind="scores", step=only) if (s.step, s.micro_batch) in pairs
        ]
        batch = self._join_scores(batch, scores)
        keep = np.ones(len(batch), bool)
        if min_version is not None:
            keep &= batch.policy_version >= min_version
        if max_version is not None:
            keep &= batch.policy_version <= max_version
        return batch if keep.all() else batch.take(keep)

    def _sid(self, s: str | SegmentRef) -> str:
        if isinstance(s, SegmentRef):
            if s.url.startswith("memory://") and s.pid != os.getpid():
                raise StoreError(per_process_message(s.url))
            return s.segment_id
        return s

    def _read_segments(self, infos: list[SegmentInfo], kind: str) -> list[Any]:
        """`seg.read_many` of `infos`, the segments this process decoded before taken from
        its cache (`SEGMENT_CACHE_BYTES`), the others read concurrently and then cached."""
        keys = [
            (self.store.url, self.store.run_id, self.agent, i.segment_id, i.attempt, kind)
            for i in infos
        ]
        out = [_cache_get(k) for k in keys]
        missing = [n for n, v in enumerate(out) if v is None]
        if missing:
            read = seg.read_many([self._job(infos[n]) for n in missing], kind)
            for n, value in zip(missing, read, strict=True):
                out[n] = value
                if SEGMENT_CACHE_BYTES:
                    _cache_put(keys[n], value)
        return out

    def _job(self, info: SegmentInfo) -> tuple[Any, str, int]:
        folder = self._p("segments", info.segment_id, info.attempt)
        return (
            self.backend.zarr_store(folder, read_only=True),
            self.backend.url_of(folder),
            info.rows,
        )

    def _join_scores(self, batch: SampleBatch, infos: list[SegmentInfo]) -> SampleBatch:
        if not infos or not len(batch):
            return batch
        reward, adv = batch.reward.copy(), batch.advantage.copy()
        status = batch.score_status.astype(object)
        index = {sid: i for i, sid in enumerate(batch.sample_id.tolist())}
        source: dict[int, str] = {}
        for info, cols in zip(infos, self._read_segments(infos, "scores"), strict=True):
            for sid, r, a, st in zip(
                cols["sample_id"].tolist(),
                cols["reward"],
                cols["advantage"],
                cols["status"].tolist(),
                strict=True,
            ):
                i = index.get(sid)
                if i is None:
                    continue
                if i in source and not _same_score((reward[i], adv[i], status[i]), (r, a, st)):
                    raise StoreError(
                        f"sample {sid} has different scores in segments {source[i]} and "
                        f"{info.segment_id} of table {self.agent!r}"
                    )
                reward[i], adv[i], status[i], source[i] = r, a, st, info.segment_id
        return batch.replace(reward=reward, advantage=adv, score_status=status.astype(np.str_))

    # -- consumption log -----------------------------------------------------------------
    def record_consumption(
        self,
        step: int,
        segment_ids: list[str],
        versions: list[int],
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Write ``consumed/{step}.json`` once; an identical re-record (a retry) is a no-op."""
        for sid in segment_ids:
            self._info(sid)
        record = {
            "step": int(step),
            "agent": self.agent,
            "segments": sorted(segment_ids),
            "versions": sorted({int(v) for v in versions}),
            "extra": extra or {},
            "recorded_at": time.time(),
        }
        path = self._p("consumed", f"{int(step)}.json")
        if self.backend.put_if_absent(path, dumps(record)):
            return
        old = read_json(self.backend, path, "consumption record")
        if (old.get("segments"), old.get("versions")) != (record["segments"], record["versions"]):
            raise StoreError(
                f"step {step} of table {self.agent!r} was already recorded as consuming other "
                f"segments/versions at {self.backend.url_of(path)}; it is left unchanged"
            )

    def consumption(self, step: int) -> dict[str, Any] | None:
        try:
            return read_json(
                self.backend, self._p("consumed", f"{int(step)}.json"), "consumption record"
            )
        except FileNotFoundError:
            return None

    def consumption_log(self) -> dict[int, dict[str, Any]]:
        out = {}
        for name in self.backend.listdir(self._p("consumed")):
            if name.endswith(".json") and name[:-5].isdigit():
                record = self.consumption(int(name[:-5]))
                if record is not None:
                    out[int(name[:-5])] = record
        return dict(sorted(out.items()))


def _same_score(a: tuple[float, float, str], b: tuple[float, float, str]) -> bool:
    """Equal scores; NaN (a failed sample's reward under `drop_group`) equals NaN."""
    same = (x == y or (np.isnan(x) and np.isnan(y)) for x, y in zip(a[:2], b[:2], strict=True))
    return a[2] == b[2] and all(same)
