"""Before a run on a cluster the driver did not start: can every worker open what the run
names? A local model directory or a `file://` store that only the driver's machine has
would otherwise fail in the first task on some host, long after the start.

`local_paths(spec, store_url)` lists what must exist on the workers' own filesystems (hub
names and URLs are fetched, not checked); `check_reachable` asks every worker for them at
once and names each worker that lacks one, with the fixes.
"""

from __future__ import annotations

import os
from typing import Any

from engines.model_files import is_remote
from flows.runs.record import RunError
from meg import MEGSpec, is_hub_name


def local_paths(spec: MEGSpec, store_url: str | None) -> dict[str, str]:
    """What → local path, for everything the workers must find on their own disk."""
    out: dict[str, str] = {}
    for name, agent in spec.agents.items():
        for what, path in (("model", agent.model), ("tokenizer", agent.tokenizer)):
            if path and not is_hub_name(path) and not is_remote(path):
                out[f"{what} of agent {name!r}"] = path.removeprefix("file://")
    if store_url is not None and not is_remote(store_url):
        out["MEG Store folder"] = store_url.removeprefix("file://")
    return out


def _missing(paths: dict[str, str]) -> dict[str, str]:
    return {what: p for what, p in paths.items() if not os.path.exists(p)}


def check_reachable(client: Any, spec: MEGSpec, store_url: str | None) -> None:
    """Raise RunError naming every worker that cannot see a path of `local_paths`."""
    paths = local_paths(spec, store_url)
    if not paths:
        return
    found = client.run(_missing, paths)
    names = {a: w.get("name", a) for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
    lines = [
        f"worker {names.get(addr, addr)} ({addr}) has no {what} {path}"
        for addr, missing in sorted(found.items())
        for what, path in missing.items()
    ]
    if lines:
        raise RunError(
            "the cluster's workers cannot open what this run names:\n  "
            + "\n  ".join(lines)
            + "\nOn hosts without a shared filesystem put models where every host can read "
            "them (`flexmarl model push DIR s3://BUCKET/models/NAME`, then `model: "
            "s3://BUCKET/models/NAME`) and the store on S3 (`--store s3://BUCKET/flexmarl`)."
        )
