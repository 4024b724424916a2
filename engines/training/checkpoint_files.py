"""How a checkpoint directory is written and checked: whole or not at all, sha256 per file.

Write (`write_dir`): every file is built in memory first, its sha256 goes into `meta.json`
(`seal`) and `meta.json` is written last, so it stays the commit marker and checkpoints
from before digests still count as committed. On a local disk the files go to a hidden
sibling folder `.<name>.<random>.partial` that is renamed into place once complete: a full
disk or a kill never leaves a `vNNNNNN` folder behind, and the partial folder is removed
on any error, giving the space back. On an object store (no folder rename, but each PUT is
atomic) the files are written in place, `meta.json` last. Either way a checkpoint being
rewritten is uncommitted (its `meta.json` removed) before anything else changes.

Check (`unseal`, `check_files`): the bytes read are hashed against the digest; a mismatch,
a listed file that is missing, or a `meta.json` that is not JSON or does not match its own
hash is a `CorruptCheckpointError`. `meta.json`'s own hash covers its other fields (the
canonical JSON without `digest`), so a flipped digit in `version` is caught too.
`quarantine` renames a corrupt checkpoint aside (`vNNNNNN.corrupt`); nothing is deleted.

Hashing a checkpoint means reading all of it, and `latest_checkpoint` is asked before every
training task; so a process remembers what it verified or wrote, with each file's size and
mtime, and checks those (stat calls) instead of the bytes while they are unchanged. A load
always hashes the bytes it reads.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from storage.fs import open_fs

log = logging.getLogger("engines.training.checkpoint")

META_FILE = "meta.json"
STATE_FILE = "state.safetensors"
DIGEST_KEY = "digest"
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class CheckpointError(OSError):
    """A checkpoint that could not be written (errno set, e.g. ENOSPC) or read as recorded."""


class CorruptCheckpointError(CheckpointError):
    """A committed checkpoint whose bytes do not match its recorded digest."""


@dataclass(frozen=True, slots=True)
class Digest:
    """What `meta.json` records: sha256 of every other file, and of its own other fields."""

    files: Mapping[str, str]
    meta: str


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(meta: Mapping[str, Any]) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def seal(meta: Mapping[str, Any], files: Mapping[str, bytes]) -> bytes:
    """The bytes of `meta.json` for `meta` and the checkpoint's other `files`."""
    digest = {
        "algorithm": "sha256",
        "files": {name: sha256(data) for name, data in sorted(files.items())},
        "meta": sha256(_canonical(meta)),
    }
    return json.dumps({**meta, DIGEST_KEY: digest}, indent=1, sort_keys=True).encode()


def unseal(url: str, raw: bytes) -> tuple[dict[str, Any], Digest | None]:
    """(meta without its digest, the digest or None for a checkpoint from before digests)."""
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"checkpoint {url}: {META_FILE} is not JSON ({e})") from e
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"checkpoint {url}: {META_FILE} is not a JSON object")
    recorded = meta.pop(DIGEST_KEY, None)
    if recorded is None:
        return meta, None
    try:
        digest = Digest(dict(recorded["files"]), str(recorded["meta"]))
        ok = recorded["algorithm"] == "sha256" and all(
            isinstance(v, str) for v in digest.files.values()
        )
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise CorruptCheckpointError(f"checkpoint {url}: the digest in {META_FILE} is damaged")
    if sha256(_canonical(meta)) != digest.meta:
        raise CorruptCheckpointError(
            f"checkpoint {url}: {META_FILE} does not match its own recorded sha256"
        )
    return meta, digest


def check_files(url: str, digest: Digest, blobs: Mapping[str, bytes | None]) -> None:
    """Raise CorruptCheckpointError unless every recorded file is present and matches."""
    for name, want in sorted(digest.files.items()):
        data = blobs.get(name)
        if data is None:
            raise CorruptCheckpointError(f"checkpoint {url}: {name} is missing")
        if sha256(data) != want:
            raise CorruptCheckpointError(
                f"checkpoint {url}: {name} does not match its recorded sha256 "
                f"({len(data)} bytes; damaged or cut short)"
            )


def write_dir(url: str, files: Mapping[str, bytes]) -> None:
    """Write checkpoint directory `url` from `files` (written in order: `meta.json` last).
    Any OSError becomes a CheckpointError naming `url` (ENOSPC: "no space left")."""
    fs, path = open_fs(url)
    try:
        if isinstance(fs, LocalFileSystem):
            _write_local(path.rstrip("/"), files)
        else:
            _write_in_place(fs, path.rstrip("/"), files)
    except OSError as e:
        raise _write_error(url, e) from e


def _write_error(url: str, e: OSError) -> CheckpointError:
    if e.errno in FULL_ERRNOS:
        return CheckpointError(
            e.errno,
            f"no space left writing checkpoint {url} ({e.strerror}); nothing of it was "
            "committed and the previous checkpoint stays the latest — free space, then "
            "resume the run",
        )
    return CheckpointError(e.errno, f"could not write checkpoint {url}: {e}")


def _write_local(path: str, files: Mapping[str, bytes]) -> None:
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        os.mkdir(tmp)
        for rel, data in files.items():
            with open(os.path.join(tmp, rel), "wb") as f:
                f.write(data)
        if os.path.exists(path):  # a rewrite: uncommit the old one, swap, drop it
            with suppress(FileNotFoundError):
                os.remove(os.path.join(path, META_FILE))
            old = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.old")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # give the space back
        raise


def _write_in_place(fs: Any, path: str, files: Mapping[str, bytes]) -> None:
    if fs.exists(f"{path}/{META_FILE}"):
        fs.rm_file(f"{path}/{META_FILE}")  # uncommit first: a rewrite cut short is ignored
    fs.makedirs(path, exist_ok=True)
    try:
        for rel, data in files.items():
            fs.pipe_file(f"{path}/{rel}", data)
    except BaseException:
        with suppress(OSError):  # best effort; without meta.json nothing here is read
            fs.rm(path, recursive=True)
        raise


def quarantine(url: str) -> str | None:
    """Rename checkpoint `url` to `url.corrupt` (`.corrupt.2`, ... if taken); its new URL,
    or None if another process moved it first. Never deletes: a human may want the bytes."""
    fs, path = open_fs(url)
    path = path.rstrip("/")
    dest, n = f"{path}.corrupt", 1
    while fs.exists(dest):
        n += 1
        dest = f"{path}.corrupt.{n}"
    try:
        fs.mv(path, dest, recursive=True)
    except FileNotFoundError:
        return None
    return url.rstrip("/") + dest[len(path) :]


def read_dir(
    url: str, need: tuple[str, ...], *, load: bool = True
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(meta, file bytes) of committed checkpoint `url`, its digest checked: every recorded
    file is read and hashed. A checkpoint from before digests has only `need` read (or, with
    `load=False`, checked to exist). FileNotFoundError: no `meta.json`, so no committed
    checkpoint; CorruptCheckpointError: damaged or missing bytes under a `meta.json`."""
    fs, path = open_fs(url)
    raw = _cat_or_none(fs, f"{path}/{META_FILE}")
    if raw is None:
        raise FileNotFoundError(f"checkpoint {url!r} has no {META_FILE} (unfinished or wrong dir)")
    meta, digest = unseal(url, raw)
    if digest is not None:
        blobs = {n: _cat_or_none(fs, f"{path}/{n}") for n in digest.files}
        check_files(url, digest, blobs)
        missing = [n for n in need if n not in blobs]  # a digest that omits a needed file
    else:
        note(url, "has no digest (written before FlexMARL recorded one): loaded unverified")
        read = _cat_or_none if load else _present
        blobs = {n: read(fs, f"{path}/{n}") for n in need}
        missing = [n for n, b in blobs.items() if b is None]
    if missing:
        raise CorruptCheckpointError(f"checkpoint {url}: {missing[0]} is missing")
    remember_verified(url)
    return meta, {n: b for n, b in blobs.items() if b is not None}


def _cat_or_none(fs: Any, path: str) -> bytes | None:
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError:
        return None


def _present(fs: Any, path: str) -> bytes | None:
    return b"" if fs.exists(path) else None


_NOTED: set[str] = set()  # (url, what) already logged in this process


def note(url: str, what: str) -> None:
    """Log "checkpoint <url> <what>" once per process (it is asked before every task)."""
    if (key := f"{url} {what}") not in _NOTED:
        _NOTED.add(key)
        log.warning("checkpoint %s %s", url, what)


# url -> fingerprint (meta.json bytes, every file's size and mtime) when last verified here
_VERIFIED: dict[str, str] = {}


def _fingerprint(url: str) -> str | None:
    """What must be unchanged for an earlier verification to still hold; None if the
    checkpoint has no `meta.json`."""
    fs, path = open_fs(url)
    try:
        raw = fs.cat_file(f"{path}/{META_FILE}")
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return None
    stats = sorted(
        (str(e["name"]).rsplit("/", 1)[-1], e.get("size"), str(_mtime(e))) for e in entries
    )
    return sha256(raw + json.dumps(stats).encode())


def _mtime(entry: Mapping[str, Any]) -> Any:
    for key in ("mtime", "LastModified", "ETag", "created"):  # local, s3, s3, memory
        if entry.get(key) is not None:
            return entry[key]
    return None


def remember_verified(url: str) -> None:
    """Record that `url` was just verified (or written from the bytes its digest names)."""
    if (fp := _fingerprint(url)) is not None:
        _VERIFIED[url] = fp


def already_verified(url: str) -> bool:
    return url in _VERIFIED and _VERIFIED[url] == _fingerprint(url)
