"""Which checkpoints exist under an agent's root, which is the newest intact one, and pruning.

Torch-free on purpose: the driver answers "where does a resume start?" (`flows.runs.record`) and the
training tasks count already-trained steps (`tasks.accounting`) from these, and the driver
must not pay torch's import for it. Loading and writing the tensors is `checkpoint`.
"""

from __future__ import annotations

import logging
import re

from engines.training.checkpoint_files import (
    META_FILE,
    STATE_FILE,
    CorruptCheckpointError,
    already_verified,
    note,
    quarantine,
    read_dir,
)
from storage.fs import open_fs

log = logging.getLogger(__name__)


def checkpoint_dir(root: str, version: int) -> str:
    return f"{root.rstrip('/')}/v{version:06d}"


def verify_checkpoint(url: str) -> None:
    """Check checkpoint `url` against its digest (CorruptCheckpointError if damaged;
    FileNotFoundError if it has no `meta.json`). A checkpoint this process already verified
    (or wrote) and whose files have not changed since (size, mtime) is not read again."""
    if not already_verified(url):
        read_dir(url, (STATE_FILE,), load=False)


def committed_checkpoints(root: str) -> list[str]:
    """URLs of the committed checkpoints under `root` (meta.json written), oldest first."""
    return [url for url, committed in _scan(root) if committed]


def _scan(root: str) -> list[tuple[str, bool]]:
    """Every `vNNNNNN` folder under `root`, oldest first, and whether it is committed."""
    fs, path = open_fs(root)
    if not fs.exists(path):
        return []
    names = sorted(
        name
        for name in (p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(path, detail=False))
        if re.fullmatch(r"v\d{6}", name)
    )
    base = path.rstrip("/")
    return [(f"{root.rstrip('/')}/{n}", bool(fs.exists(f"{base}/{n}/{META_FILE}"))) for n in names]


def prune_checkpoints(root: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` committed checkpoints; return the deleted URLs.
    Uncommitted directories (a write in progress or cut short) are left alone."""
    old = committed_checkpoints(root)[:-keep]
    for url in old:
        fs, path = open_fs(url)
        fs.rm(f"{path}/{META_FILE}")  # uncommit first: a cut-short delete is then ignored
        fs.rm(path, recursive=True)
    return old


def latest_checkpoint(root: str) -> str | None:
    """URL of the newest committed checkpoint under `root` that matches its digest, or None.
    A corrupt one is renamed aside (`quarantine`) with a warning and the previous one is
    tried: what a resume will actually load, so step accounting agrees with it. A newer
    folder without `meta.json` (a prune cut short, an older FlexMARL's write cut short, or
    a deleted file) is ignored, with a note."""
    for url, committed in reversed(_scan(root)):
        if not committed:
            note(url, f"has no {META_FILE} (being written, cut short, or damaged): ignored")
            continue
        try:
            verify_checkpoint(url)
        except CorruptCheckpointError as e:
            set_aside(url, e)
            continue
        return url
    return None


def set_aside(url: str, why: CorruptCheckpointError) -> None:
    moved = quarantine(url)
    log.warning(
        "%s; moved aside to %s (not deleted), using the previous checkpoint",
        why,
        moved or "(already moved by another process)",
    )
