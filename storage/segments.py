"""Encode and decode one segment attempt as a Zarr v3 group (schema_version 3).

Layout: zarr costs ~1 ms of Python per *array* (metadata, codec pipeline, event-loop hops)
and little per byte at segment sizes, so columns that share a dtype and a length are packed
as the rows of one 2-D array: ``row_int64[k]`` is column ``row_int64.attrs["columns"][k]``.
A rows segment is 9 arrays (19 columns), a score segment 2. Ragged token values stay 1-D.

Every array is one chunk (a segment is one task's output: ~10²-10⁴ rows), stored
uncompressed with a CRC32C checksum: random-looking token ids barely compress, and the
checksum turns a damaged chunk into an error instead of silently wrong tokens.

Writing encodes the whole group in memory first (zarr ``MemoryStore``, all arrays
concurrently through the async API), then hands the files to the backend in one call
(local disk: plain writes in this thread; S3: concurrent PUTs). The attempt folder is
private until its commit marker exists, so files need no per-file temp+rename.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import zarr.api.asynchronous as za
from zarr.abc.store import Store
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.buffer import Buffer
from zarr.core.sync import sync
from zarr.dtype import ZDType, parse_data_type
from zarr.storage import MemoryStore

from storage.errors import IntegrityError, StoreUnavailableError
from storage.schema import STR_COLUMNS, SampleBatch

# array name -> the columns packed in it (row k = column k), or None for a 1-D column array
Layout = Mapping[str, tuple[str, ...] | None]
ROWS_LAYOUT: Layout = {
    "strings": STR_COLUMNS,  # (7, N) str
    "row_int64": ("step", "policy_version"),  # (2, N)
    "row_float32": ("reward", "advantage"),  # (2, N)
    "row_float64": ("gen_start", "gen_end"),  # (2, N)
    "offsets": ("prompt_offsets", "response_offsets"),  # (2, N+1) int64
    "prompt_ids": None,  # (P,) int32
    "response_ids": None,  # (R,) int32
    "logprobs": None,  # (R,) float32
    "token_versions": None,  # (R,) int64, zstd: one run of equal values per row, ~free
}
COMPRESSED = frozenset({"token_versions"})
SCORES_LAYOUT: Layout = {"strings": ("sample_id", "status"), "row_float32": ("reward", "advantage")}
# columns a segment written by an earlier version lacks, and the value they read back as
# (score segments before the status column held only scored-as-usual rows; rows segments
# before the source column only the agent's own samples)
DEFAULTS: Mapping[str, str] = {"status": "ok", "source": ""}
LAYOUTS: dict[str, Layout] = {"rows": ROWS_LAYOUT, "scores": SCORES_LAYOUT, "carry": ROWS_LAYOUT}


def pack(columns: Mapping[str, np.ndarray], layout: Layout) -> dict[str, np.ndarray]:
    """Columns -> the arrays of ``layout`` (packed ones are (k, n): one row per column)."""
    return {
        name: columns[name] if cols is None else np.stack([columns[c] for c in cols])
        for name, cols in layout.items()
    }


def unpack(
    where: str, arrays: Mapping[str, tuple[np.ndarray, Any]], layout: Layout
) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack`; ``arrays`` maps name -> (values, attrs["columns"])."""
    out: dict[str, np.ndarray] = {}
    for name, cols in layout.items():
        values, stored = arrays[name]
        want = 1 if cols is None else 2
        older = cols is not None and isinstance(stored, list) and _older_columns(stored, cols)
        if values.ndim != want or (cols is not None and stored != list(cols) and not older):
            raise IntegrityError(
                f"segment {where} is damaged: array {name!r} has {values.ndim} dims and columns "
                f"{stored!r}; expected {want} dims and columns {cols!r}"
            )
        if values.dtype.kind == "T":  # zarr gives numpy StringDType; batches use "<U"
            values = np.asarray(values.tolist(), np.str_).reshape(values.shape)
        if cols is None:
            out[name] = values
            continue
        out.update(zip(stored, values, strict=True))
        n = values.shape[1]
        out.update({c: np.full(n, DEFAULTS[c]) for c in cols if c not in stored})
    return out


def _older_columns(stored: list[str], cols: tuple[str, ...]) -> bool:
    """`stored` is `cols` as an earlier version wrote them: the same order, less columns
    that have a default."""
    return [c for c in cols if c in stored] == stored and all(
        c in DEFAULTS for c in cols if c not in stored
    )


@cache
def _zarr_dtype(dtype: np.dtype[Any] | type[str]) -> ZDType[Any, Any]:
    """Zarr's data type for a column's numpy dtype (`str`: variable-length UTF-8), looked up
    once: zarr matches a numpy dtype against every registered type on each `create_array`.
    The same files, byte for byte, encoded faster (docs/store.md#benchmark)."""
    return parse_data_type(dtype, zarr_format=3)


async def _encode(
    arrays: dict[str, np.ndarray], layout: Layout, attrs: dict[str, Any]
) -> dict[str, Buffer]:
    files: dict[str, Buffer] = {}
    group = await za.create_group(store=MemoryStore(files), attributes=attrs)

    async def one(name: str, values: np.ndarray) -> None:
        is_str = values.dtype.kind in "UT"
        cols = layout[name]
        arr = await group.create_array(
            name,
            shape=values.shape,
            dtype=_zarr_dtype(str if is_str else values.dtype),
            chunks=tuple(max(1, s) for s in values.shape),
            compressors=[ZstdCodec(), Crc32cCodec()] if name in COMPRESSED else [Crc32cCodec()],
            fill_value="" if is_str else 0,
            attributes={} if cols is None else {"columns": list(cols)},
            config={"write_empty_chunks": True},  # every chunk is a file: none is implied
        )
        if values.size:
            await arr.setitem(Ellipsis, values)

    await asyncio.gather(*(one(n, v) for n, v in arrays.items()))
    return files


def encode(
    columns: Mapping[str, np.ndarray], kind: str, attrs: dict[str, Any]
) -> dict[str, memoryview]:
    """The files of one segment group: relative key -> bytes, metadata first, then chunks
    smallest first (a writer killed midway leaves an invisible, partial attempt)."""
    files = sync(_encode(pack(columns, LAYOUTS[kind]), LAYOUTS[kind], attrs))
    views = {k: memoryview(v.as_buffer_like()) for k, v in files.items()}
    return dict(
        sorted(views.items(), key=lambda kv: (not kv[0].endswith("zarr.json"), kv[1].nbytes))
    )


async def _read_arrays(store: Store, names: tuple[str, ...]) -> dict[str, tuple[np.ndarray, Any]]:
    group = await za.open_group(store=store, mode="r")

    async def one(name: str) -> tuple[str, tuple[np.ndarray, Any]]:
        arr = await group.getitem(name)
        if not isinstance(arr, za.AsyncArray):
            raise TypeError(f"{name} is a group, expected an array")
        values = np.asarray(await arr.getitem(Ellipsis))
        return name, (values, arr.metadata.attributes.get("columns"))

    return dict(await asyncio.gather(*(one(n) for n in names)))


async def _read_checked(store: Store, where: str, layout: Layout) -> dict[str, np.ndarray]:
    try:
        raw = await _read_arrays(store, tuple(layout))
    except StoreUnavailableError:  # the server is down, the segment is not damaged
        raise
    except FileNotFoundError as e:
        raise IntegrityError(f"segment data missing under {where}: {e}") from e
    except (KeyError, ValueError, RuntimeError, OSError, TypeError) as e:
        # zarr raises many types for damaged metadata or chunks (checksum, shape, JSON)
        raise IntegrityError(
            f"segment {where} cannot be read ({type(e).__name__}: {e}); the files are left "
            "untouched — restore them, or delete its commit marker to drop the segment"
        ) from e
    return unpack(where, raw, layout)


def _rows(where: str, cols: dict[str, np.ndarray], expected_rows: int) -> SampleBatch:
    try:
        batch = SampleBatch(**cols)
    except ValueError as e:
        raise IntegrityError(f"segment {where} is damaged: {e}") from e
    if len(batch) != expected_rows:
        raise IntegrityError(
            f"segment {where} has {len(batch)} rows but its commit marker says {expected_rows}"
        )
    return batch


def _scores(where: str, cols: dict[str, np.ndarray], expected_rows: int) -> dict[str, np.ndarray]:
    if any(len(c) != expected_rows for c in cols.values()):
        raise IntegrityError(f"score segment {where} does not have {expected_rows} rows per column")
    return cols


def read_many(jobs: list[tuple[Store, str, int]], kind: str) -> list[Any]:
    """Read segments concurrently. ``jobs``: (zarr store, path for errors, expected rows).

    Returns SampleBatch per job for kind "rows", a column dict per job for "scores".
    """
    layout = LAYOUTS[kind]
    finish = _scores if kind == "scores" else _rows

    async def all_jobs() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(_read_checked(s, w, layout) for s, w, _ in jobs))

    results = sync(all_jobs()) if jobs else []
    return [finish(w, cols, n) for (_, w, n), cols in zip(jobs, results, strict=True)]
