"""StateStore: put/get/move named tensor dicts wherever they live.

Locations: ``Device(name)`` (a torch device in this process), ``Host()`` (CPU memory in
this process), ``Url(url)`` (an fsspec folder: safetensors + JSON), ``Worker(address)``
(host memory of another Dask worker process). Callers never branch on location: the same
``get``/``move`` works for all, through a registry of location handlers.

``put`` snapshots (copies) the tensors, so later in-place updates by the caller (an
optimizer step) do not leak into the stored state. A Host state is copied into host buffers
kept per key and reused by the key's next put, page-locked when the state comes from a GPU,
with asynchronous copies (``storage.host_buffers``): a slot swap runs at the link's speed.
The content hash (sha256 over names, dtypes, shapes and raw bytes) is lazy: it is computed
when a state leaves the process (written to a URL or sent to a Worker) and checked whenever
it is read back from there.
In-process states (Host/Device) are never hashed on put/get/move — hashing every byte
cost more than the copy itself for a training-slot swap — so their ``StateRef.sha256``
is ``""``; ``StateStore.digest(key)`` computes it on demand. Nothing is pickled to disk.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from storage.errors import IntegrityError, StoreError
from storage.fs import open_fs
from storage.host_buffers import HostBuffers, to_device

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True, slots=True)
class Device:
    name: str = "cpu"


@dataclass(frozen=True, slots=True)
class Host:
    pass


@dataclass(frozen=True, slots=True)
class Url:
    url: str = ""  # "" = the StateStore's root_url


@dataclass(frozen=True, slots=True)
class Worker:
    address: str


Location = Device | Host | Url | Worker


@dataclass(frozen=True, slots=True)
class StateRef:
    key: str
    location: Location
    nbytes: int
    sha256: str  # content_hash(...) of URL/Worker states; "" for in-process (see digest())
    meta: dict[str, Any] = field(default_factory=dict)


_KEY_RE = re.compile(r"^[A-Za-z0-9_.@=-]+(/[A-Za-z0-9_.@=-]+)*$")


def check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key) or ".." in key.split("/"):
        raise StoreError(f"state key {key!r} is not valid: use path-safe parts joined by '/'")
    return key


def content_hash(tensors: Tensors) -> str:
    """sha256 over (name, dtype, shape, raw bytes) in name order; same for every location."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)  # no copy
    return h.hexdigest()


def _nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


# -- location handlers (registry keyed by location type) ----------------------------------
Handler = tuple[
    Callable[["StateStore", Any, str, Tensors, dict[str, Any]], str],  # put -> sha256 or ""
    Callable[["StateStore", Any, str, str], tuple[Tensors, dict[str, Any]]],  # get(sha)
    Callable[["StateStore", Any, str], None],  # delete
]
_HANDLERS: dict[type, Handler] = {}


def _register(kind: type, put: Any, get: Any, delete: Any) -> None:
    _HANDLERS[kind] = (put, get, delete)


def _mem_put(s: StateStore, loc: Device | Host, key: str, t: Tensors, meta: dict[str, Any]) -> str:
    """A Device state is a copy on that device; a Host state lives in the key's reused
    (pinned, from a GPU) host buffers (storage.host_buffers)."""
    staged = to_device(t, loc.name) if isinstance(loc, Device) else s._host.stage(key, t)
    s._memory[key] = (staged, meta)
    return ""  # in-process: not hashed (see the module docstring)


def _mem_get(s: StateStore, loc: Any, key: str, sha: str) -> tuple[Tensors, dict[str, Any]]:
    return s._memory[key]


def _mem_delete(s: StateStore, loc: Any, key: str) -> None:
    s._memory.pop(key, None)


_register(Device, _mem_put, _mem_get, _mem_delete)
_register(Host, _mem_put, _mem_get, _mem_delete)


def _url_put(s: StateStore, loc: Url, key: str, t: Tensors, meta: dict[str, Any]) -> str:
    fs, base = s._fs(loc, key)
    fs.makedirs(base, exist_ok=True)
    cpu = to_device(t, "cpu")
    sha = content_hash(cpu)  # of the bytes written, so a later read can check them
    fs.pipe_file(f"{base}/tensors.safetensors", st_save(cpu))
    doc = {
        "format": "flexmarl-state",
        "key": key,
        "sha256": sha,
        "nbytes": _nbytes(t),
        "meta": meta,
    }
    fs.pipe_file(f"{base}/state.json", json.dumps(doc, indent=1).encode())  # written last
    return sha


def _url_get(s: StateStore, loc: Url, key: str, sha: str) -> tuple[Tensors, dict[str, Any]]:
    fs, base = s._fs(loc, key)
    doc = s._read_doc(loc, key)
    try:
        tensors = st_load(fs.cat_file(f"{base}/tensors.safetensors"))
    except FileNotFoundError:
        raise StoreError(
            f"state {key!r}: tensors file missing at {base}/tensors.safetensors"
        ) from None
    except Exception as e:  # safetensors raises its own error type for damaged headers
        raise IntegrityError(f"state {key!r}: cannot parse {base}/tensors.safetensors: {e}") from e
    if content_hash(tensors) != doc["sha256"]:
        raise IntegrityError(
            f"state {key!r}: {base}/tensors.safetensors does not match the sha256 in state.json "
            "(corrupt or partially written file); it was left untouched"
        )
    return tensors, doc["meta"]


def _url_delete(s: StateStore, loc: Url, key: str) -> None:
    fs, base = s._fs(loc, key)
    if fs.exists(base):
        fs.rm(base, recursive=True)


_register(Url, _url_put, _url_get, _url_delete)


# Lives in each worker process. States cross processes as safetensors bytes (in memory):
# distributed's torch serializer rejects bfloat16, and bytes keep the copy bit-exact.
_WORKER_STATES: dict[str, tuple[bytes, dict[str, Any]]] = {}


def _w_put(key: str, blob: bytes, meta: dict[str, Any]) -> None:
    _WORKER_STATES[key] = (blob, meta)


def _w_get(key: str) -> tuple[bytes, dict[str, Any]]:
    return _WORKER_STATES[key]


def _worker_put(s: StateStore, loc: Worker, key: str, t: Tensors, meta: dict[str, Any]) -> str:
    cpu = to_device(t, "cpu")
    sha = content_hash(cpu)  # checked when the state comes back (_worker_get)
    _on_worker(loc.address, _w_put, key, st_save(cpu), meta)
    return sha


def _worker_get(s: StateStore, loc: Worker, key: str, sha: str) -> tuple[Tensors, dict[str, Any]]:
    try:
        blob, meta = _on_worker(loc.address, _w_get, key)
    except KeyError:
        raise StoreError(f"state {key!r} is not held by worker {loc.address}") from None
    tensors = st_load(blob)
    if content_hash(tensors) != sha:
        raise IntegrityError(
            f"state {key!r} held by worker {loc.address} does not match its sha256 {sha}"
        )
    return tensors, meta


def _w_del(key: str) -> None:
    _WORKER_STATES.pop(key, None)


def _on_worker(address: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in the worker process at ``address`` (directly if that is this process)."""
    from distributed import get_client, get_worker

    try:
        if get_worker().address == address:
            return fn(*args)
    except ValueError:
        pass  # not inside a worker
    try:
        client = get_client()
    except ValueError as e:
        raise StoreError(f"Worker({address!r}) location needs a Dask client in this process") from e
    return client.run(fn, *args, workers=[address])[address]


_register(
    Worker, _worker_put, _worker_get, lambda s, loc, key: _on_worker(loc.address, _w_del, key)
)


class StateStore:
    """Named tensor dicts in any location; one index per process, URLs discoverable by all."""

    def __init__(self, root_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root_url = root_url.rstrip("/")
        # with the MEG Store's retry policy (storage.fs): states on S3 retry like segments
        self.storage_options = dict(storage_options or {})
        self._refs: dict[str, StateRef] = {}
        self._memory: dict[str, tuple[Tensors, dict[str, Any]]] = {}
        self._host = HostBuffers()  # per-key host buffers of Host states, reused

    def url_for(self, key: str) -> str:
        return f"{self.root_url}/{check_key(key)}"

    def _norm(self, loc: Location) -> Location:
        if type(loc) not in _HANDLERS:
            known = sorted(k.__name__ for k in _HANDLERS)
            raise StoreError(f"unknown location {loc!r}; known location types: {known}")
        return Url(self.root_url) if isinstance(loc, Url) and not loc.url else loc

    def _fs(self, loc: Url, key: str) -> tuple[Any, str]:
        fs, base = open_fs(f"{loc.url.rstrip('/')}/{key}", self.storage_options)
        return fs, base

    def _read_doc(self, loc: Url, key: str) -> dict[str, Any]:
        fs, base = self._fs(loc, key)
        try:
            doc = json.loads(fs.cat_file(f"{base}/state.json"))
            _ = doc["sha256"], doc["meta"], doc["nbytes"]
        except FileNotFoundError:
            raise StoreError(f"no state {key!r} at {loc.url}/{key} (state.json missing)") from None
        except (ValueError, KeyError, TypeError) as e:
            raise IntegrityError(f"corrupt state manifest {base}/state.json: {e!r}") from e
        return dict(doc)

    def put(
        self,
        key: str,
        tensors: Tensors,
        meta: dict[str, Any] | None = None,
        *,
        at: Location = Host(),
    ) -> StateRef:
        check_key(key)
        loc = self._norm(at)
        meta = dict(meta or {})
        try:
            json.dumps(meta)
        except TypeError as e:
            raise StoreError(f"state {key!r}: meta must be JSON-serialisable ({e})") from e
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise StoreError(f"state {key!r}: {name!r} is {type(t).__name__}, not a tensor")
        return self._store(StateRef(key, loc, _nbytes(tensors), "", meta), tensors)

    def _store(self, ref: StateRef, tensors: Tensors) -> StateRef:
        old = self._refs.get(ref.key)
        sha = _HANDLERS[type(ref.location)][0](self, ref.location, ref.key, tensors, ref.meta)
        ref = replace(ref, sha256=sha)
        in_memory = (Device, Host)
        both_memory = (
            old is not None
            and isinstance(old.location, in_memory)
            and isinstance(ref.location, in_memory)
        )  # the in-process dict entry was just replaced: nothing left to delete
        if old is not None and old.location != ref.location and not both_memory:
            _HANDLERS[type(old.location)][2](self, old.location, ref.key)
        self._refs[ref.key] = ref
        return ref

    def ref(self, key: str) -> StateRef:
        if key in self._refs:
            return self._refs[key]
        loc = Url(self.root_url)
        doc = self._read_doc(loc, check_key(key))  # discoverable from another process
        return StateRef(key, loc, int(doc["nbytes"]), str(doc["sha256"]), dict(doc["meta"]))

    def digest(self, key: str) -> str:
        """The state's content hash: recorded for URL/Worker states, computed now (not
        cached: a zero-copy ``get`` hands out the stored tensors) for in-process ones."""
        ref = self.ref(key)
        if ref.sha256:
            return ref.sha256
        return content_hash(_HANDLERS[type(ref.location)][1](self, ref.location, key, "")[0])

    def get(self, key: str, to: Location = Host()) -> tuple[Tensors, dict[str, Any]]:
        """Tensors at ``to`` (Device or Host) plus meta; the stored state stays where it is."""
        if not isinstance(to, Device | Host):
            raise StoreError(
                f"get(to={to!r}): tensors can only be returned to a Device or Host; use move()"
            )
        ref = self.ref(key)
        tensors, meta = _HANDLERS[type(ref.location)][1](self, ref.location, key, ref.sha256)
        device = to.name if isinstance(to, Device) else "cpu"
        same = ref.location == to or (isinstance(ref.location, Host) and device == "cpu")
        if same and isinstance(ref.location, Host):
            self._host.take(key)  # handed out without a copy: never a later put's buffers
        return (dict(tensors) if same else to_device(tensors, device)), dict(meta)

    def move(self, key: str, to: Location) -> StateRef:
        ref = self.ref(key)
        loc = self._norm(to)
        if ref.location == loc:
            return ref
        tensors, _ = _HANDLERS[type(ref.location)][1](self, ref.location, key, ref.sha256)
        self._refs[key] = ref
        return self._store(replace(ref, location=loc), tensors)

    def where(self, key: str) -> Location | None:
        try:
            return self.ref(key).location
        except StoreError:
            return None

    def delete(self, key: str) -> None:
        """Remove the state. A Host state's buffers stay with the store, idle, for the
        key's next `put` (a slot's next swap-out); `release_buffers` frees them."""
        ref = self.ref(key)
        _HANDLERS[type(ref.location)][2](self, ref.location, key)
        self._refs.pop(key, None)

    def release_buffers(self, key: str) -> None:
        """Free the host buffers kept for `key` (its agent is gone); a stored Host state
        of `key` keeps its tensors."""
        if key not in self._memory:
            self._host.take(key)

    @property
    def host_buffers(self) -> HostBuffers:
        return self._host

    def keys(self, prefix: str = "") -> list[str]:
        found = set(self._refs)
        fs, base = open_fs(self.root_url, self.storage_options)
        for path in fs.glob(f"{base}/**/state.json") if fs.exists(base) else []:
            found.add(str(path)[len(base.rstrip("/")) + 1 : -len("/state.json")])
        return sorted(k for k in found if k.startswith(prefix))
