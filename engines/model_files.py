"""Model directories from wherever they live: a local path, a hub name, or a URL.

A cluster without a shared filesystem cannot open `models/tiny-math` on its workers. There a
model is put once where every host can read it, usually the object store the run already
uses (`flexmarl model push DIR s3://bucket/models/NAME`), and the MEG names it by that URL
(`model: s3://bucket/models/NAME`). Every process that opens it calls :func:`local_dir`:

- ``hf://ORG/NAME`` gives ``ORG/NAME`` (transformers and vLLM fetch and cache hub models);
- a local path is returned as it is;
- a URL of any other fsspec filesystem (``s3://``, ``gs://``, ``memory://``, ...) is
  downloaded once per host into the model cache (``FLEXMARL_MODEL_CACHE``, default
  ``~/.cache/flexmarl/models``), into a folder named after the URL and a digest of the remote
  files' names, sizes and ETags or modification times: a model replaced at the same URL is
  a new folder, never a mix. The download goes to a temporary sibling folder renamed into
  place, so two workers of one host that race download twice, one wins, and nobody opens a
  half-written model. The result is cached per process.

Credentials and endpoints come from the environment (``AWS_*`` for S3), as for checkpoints.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from storage.fs import open_fs

HUB_PREFIX = "hf://"
LOCAL_SCHEMES = ("file", "local")
CACHE_ENV = "FLEXMARL_MODEL_CACHE"


class ModelFetchError(OSError):
    """A model URL that cannot be read, or that holds no HF model (no config.json)."""


def is_remote(path: str) -> bool:
    """Whether `path` is a URL to download (neither a local path nor a hub name)."""
    scheme = path.split("://", 1)[0] if "://" in path else ""
    return bool(scheme) and scheme not in LOCAL_SCHEMES and f"{scheme}://" != HUB_PREFIX


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "flexmarl" / "models")


@functools.lru_cache(maxsize=64)
def local_dir(path: str) -> str:
    """A path transformers and vLLM can open for model `path` (module docstring)."""
    if path.startswith(HUB_PREFIX):
        return path.removeprefix(HUB_PREFIX)
    if path.startswith("file://"):
        return path.removeprefix("file://")
    if not is_remote(path):
        return path
    return str(fetch(path))


def _listing(fs: Any, root: str, url: str) -> list[tuple[str, int, str]]:
    """(relative name, size, version) of every file under the model URL."""
    try:
        found = fs.find(root, detail=True)
    except (FileNotFoundError, OSError) as e:
        raise ModelFetchError(f"cannot list model {url}: {e}") from e
    out = []
    for name, info in sorted(found.items()):
        version = next((str(info[k]) for k in ("ETag", "mtime", "LastModified") if k in info), "")
        out.append((name[len(root.rstrip("/")) + 1 :], int(info.get("size") or 0), version))
    return out


def fetch(url: str) -> Path:
    """Download model directory `url` into the cache unless there already (see module)."""
    fs, root = open_fs(url)
    files = _listing(fs, root, url)
    if "config.json" not in {name for name, _, _ in files}:
        raise ModelFetchError(
            f"{url} holds no HF model (no config.json among {len(files)} files); upload a "
            "model directory with `flexmarl model push DIR URL`"
        )
    digest = hashlib.sha256(json.dumps([url, files]).encode()).hexdigest()[:16]
    final = cache_root() / f"{url.rstrip('/').rsplit('/', 1)[-1]}-{digest}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        for name, _, _ in files:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            # streamed to disk: a shard of a real model does not fit in memory twice
            fs.get_file(f"{root.rstrip('/')}/{name}", str(tmp / name))
        try:
            os.rename(tmp, final)
        except OSError:  # another process of this host got there first: use its copy
            if not (final / "config.json").is_file():
                raise
    except OSError as e:
        raise ModelFetchError(f"cannot download model {url} to {final}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def push(local: Path, url: str) -> int:
    """Upload model directory `local` to `url` (what `flexmarl model push` runs); files put."""
    if not (local / "config.json").is_file():
        raise ModelFetchError(f"{local} is not a HF model directory (no config.json)")
    fs, root = open_fs(url)
    n = 0
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{root.rstrip('/')}/{path.relative_to(local).as_posix()}")
        n += 1
    return n
