"""The one registry type of the project: named variants, looked up by name.

Every variant the configuration names — fan-out rules, advantage estimators, policy losses,
aggregation modes, rollout and store backends, reward functions, dataset generators — is
found through a `Registry`; nothing dispatches on the same string with `if/elif`. One set
of rules everywhere:

- registering a name twice is an error (a plug-in cannot silently replace a built-in);
- an unknown name raises `UnknownNameError` (a `KeyError`) listing the known names;
- an entry may carry metadata (`register(name, reads=...)`) that `meta(name)` returns;
- an *importable* registry also resolves `module:attribute` names (the MEG's
  `fn: my_rewards:team_score`): the module is imported, the attribute checked by the
  registry's `check` function, and the result cached under that name. Metadata of such an
  entry comes from the object's `__flexmarl__` attribute (set by the registry's
  decorator-free helpers, e.g. `workloads.rewards.reward(reads=...)`);
- the modules that hold a registry's built-in entries are named where the registry is made
  (`builtins=`), the one place that lists them, and imported on its first lookup or listing:
  no module registers its entries by being imported from a package `__init__` or from the
  bottom of another module, and a registry whose built-ins need torch costs nothing until
  someone asks it for a name.

Lives in `meg` (the bottom layer) so that every layer can use it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
META_ATTR = "__flexmarl__"


class UnknownNameError(KeyError):
    """A name no registry entry has; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would print the repr, quotes and all
        return str(self.args[0])


class Registry(Generic[T]):
    """Named objects of one kind; `kind` appears in every error message."""

    def __init__(
        self,
        kind: str,
        *,
        reserved: Collection[str] = (),
        importable: bool = False,
        check: Callable[[str, Any], None] | None = None,
        builtins: Collection[str] = (),
    ) -> None:
        self.kind = kind
        self._builtins = list(builtins)  # modules not imported yet
        self._loading = threading.RLock()
        self._reserved = frozenset(reserved)
        self._importable = importable
        self._check = check
        self._items: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, *names: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: `@REG.register("grpo")` (several names: one object under each)."""

        def deco(obj: T) -> T:
            for name in names:
                self.add(name, obj, **meta)
            return obj

        return deco

    def add(self, name: str, obj: T, **meta: Any) -> None:
        if name in self._items or name in self._reserved:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if self._check is not None:
            self._check(name, obj)
        self._items[name] = obj
        self._meta[name] = dict(meta)

    def load_builtins(self) -> None:
        """Import the modules of the built-in entries (once; they register themselves)."""
        if not self._builtins:
            return
        with self._loading:  # another thread may be halfway through the same imports
            while self._builtins:
                importlib.import_module(self._builtins[0])
                self._builtins.pop(0)

    def get(self, name: str) -> T:
        if name not in self._items:
            self.load_builtins()
        if name not in self._items and self._importable and ":" in name:
            self._import(name)
        try:
            return self._items[name]
        except KeyError:
            hint = " (or module:attribute of your own)" if self._importable else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}{hint}"
            ) from None

    def meta(self, name: str) -> dict[str, Any]:
        self.get(name)
        return dict(self._meta[name])

    def _import(self, name: str) -> None:
        module, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise UnknownNameError(
                f"{self.kind} {name!r}: cannot import module {module!r} ({e}); list it under "
                "`plugins:` (a module, or a .py file next to the MEG)"
            ) from None
        except AttributeError:
            raise UnknownNameError(
                f"{self.kind} {name!r}: module {module!r} has no attribute {attr!r}"
            ) from None
        self.add(name, obj, **dict(getattr(obj, META_ATTR, {})))

    def names(self) -> list[str]:
        self.load_builtins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self.load_builtins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
