"""Weight publication: after an optimizer step the new policy goes where rollout hosts read it.

Key layout in the StateStore: `weights/{agent}/v{version:06d}` (zero-padded so that string
order is version order). The default location is `Url("")`, the store's root URL, so a
rollout host in another process finds it through `StateStore.keys`/`get` without any
handle from the trainer. Versions older than the newest `retain` are garbage-collected on
each publish; a host that still reads an old version keeps its already-loaded tensors.
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from storage.state import Location, StateRef, StateStore, Url

_VERSION = re.compile(r"^v(\d{6,})$")


def weights_key(agent: str, version: int) -> str:
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return f"weights/{agent}/v{version:06d}"


def published_versions(store: StateStore, agent: str) -> list[int]:
    """Versions of `agent` currently published, ascending."""
    prefix = f"weights/{agent}/"
    out = []
    for key in store.keys(prefix):
        m = _VERSION.match(key[len(prefix) :])
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def latest_published(store: StateStore, agent: str) -> int | None:
    """Newest published version of `agent`, or None before the first publication."""
    versions = published_versions(store, agent)
    return versions[-1] if versions else None


def gc_published(store: StateStore, agent: str, retain: int) -> list[int]:
    """Delete all but the newest `retain` versions; returns the deleted versions."""
    if retain < 1:
        raise ValueError(f"retain must be >= 1 (the newest version is always kept), got {retain}")
    old = published_versions(store, agent)[:-retain]
    for v in old:
        store.delete(weights_key(agent, v))
    return old


def publish_weights(
    store: StateStore,
    agent: str,
    version: int,
    tensors: dict[str, Tensor],
    *,
    at: Location | None = None,
    retain: int | None = 2,
    meta: dict[str, Any] | None = None,
) -> StateRef:
    """Put `tensors` at `weights/{agent}/v{version:06d}`, then GC. The names are the
    trainer's state names: HF checkpoint names, or for a LoRA agent PEFT's saved adapter
    names, with the adapter's config in `meta["lora"]` (`AgentTrainer.describe()`).

    Publishing the same version twice overwrites it (a retried task is idempotent).
    """
    ref = store.put(
        weights_key(agent, version),
        tensors,
        {**(meta or {}), "agent": agent, "version": version},
        at=Url("") if at is None else at,
    )
    if retain is not None:
        gc_published(store, agent, retain)
    return ref
