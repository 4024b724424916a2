"""Plug-ins: a workload author's own modules (rewards, dataset generators), without editing
the package — imported on the driver before validation and shipped to every Dask worker.

A MEG names them under `plugins:`; an entry is resolved once, relative to the MEG file:

- `my_rewards` or `my_rewards.py` → the file `my_rewards.py` next to the MEG, or the package
  directory `my_rewards/` there;
- anything else → an installed module (`my_org.rewards`), imported by name.

`resolve` turns the entries into their canonical form (an absolute path for a local file or
package, the module name otherwise), so a run record and `--resume` find them again.
`import_all` imports them: a local file under its stem (`my_rewards`), so `fn:
my_rewards:team_score` and the names its `@register_reward` decorators register both work.

Workers do not share the driver's directory (a remote cluster, or only another working
directory), so nothing is read from the driver's paths there: `PluginModules`, a Dask
`WorkerPlugin`, carries the sources themselves and writes them into the worker's own
directory, puts that on `sys.path` and imports them. Registered on the client, it also runs
on workers that join (or are restarted) later. An installed module is not shipped: every
worker must have it installed, like the project itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from meg.spec import MEGSpec


class PluginError(ValueError):
    """A plug-in that cannot be found or imported; the message names the entry."""


def resolve(spec: MEGSpec, base_dir: Path) -> MEGSpec:
    """`spec` with every `plugins:` entry in canonical form (see the module docstring)."""
    out = []
    for entry in spec.plugins:
        stem = entry.removesuffix(".py")
        for candidate in (base_dir / f"{stem}.py", base_dir / stem):
            if candidate.is_file() or (candidate / "__init__.py").is_file():
                out.append(str(candidate.resolve()))
                break
        else:
            if entry.endswith(".py") or "/" in entry:
                raise PluginError(f"plugin {entry!r}: no such file next to the MEG ({base_dir})")
            out.append(entry)
    return spec.model_copy(update={"plugins": out})


def module_name(entry: str) -> str:
    """The name a canonical entry is imported under (a file's or package's stem)."""
    p = Path(entry)
    return p.stem if p.is_absolute() else entry


def _import_path(path: Path) -> None:
    name = path.stem
    if name in sys.modules:
        return
    init = path / "__init__.py" if path.is_dir() else path
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(path)] if path.is_dir() else None
    )
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has one
        raise PluginError(f"plugin {str(path)!r}: not an importable file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def import_all(entries: list[str]) -> None:
    """Import every canonical entry; an error names the plug-in and what went wrong."""
    for entry in entries:
        try:
            if Path(entry).is_absolute():
                _import_path(Path(entry))
            else:
                importlib.import_module(entry)
        except PluginError:
            raise
        except Exception as e:
            raise PluginError(f"plugin {entry!r} failed to import: {type(e).__name__}: {e}") from e


def import_on_worker(entries: tuple[str, ...]) -> None:
    """On a worker: import the plug-ins by module name (their files were shipped by
    `PluginModules`; an installed module is simply imported)."""
    for entry in entries:
        name = module_name(entry)
        if name not in sys.modules:
            importlib.import_module(name)


def _sources(entry: str) -> dict[str, bytes]:
    """Relative path → bytes of a local file or package (Python sources and data files)."""
    p = Path(entry)
    if p.is_file():
        return {p.name: p.read_bytes()}
    skip = {"__pycache__"}
    return {
        str(f.relative_to(p.parent)): f.read_bytes()
        for f in sorted(p.rglob("*"))
        if f.is_file() and not skip & set(f.parts)
    }


class PluginModules(WorkerPlugin):
    """Dask worker plug-in: the sources of a run's local plug-ins, written into the worker's
    directory and imported there (module docstring). A module the worker process already
    imported is kept as it is (re-importing would register its names twice)."""

    def __init__(self, name: str, files: dict[str, bytes], modules: tuple[str, ...]) -> None:
        self.name, self.files, self.modules = name, files, modules

    def setup(self, worker: Any) -> None:
        root = Path(worker.local_directory) / "flexmarl-plugins" / self.name
        for rel, data in self.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        for module in self.modules:
            if module not in sys.modules:
                importlib.import_module(module)


def worker_plugin(run_id: str, entries: list[str]) -> PluginModules | None:
    """The worker plug-in shipping `entries`' local files, or None when there are none."""
    local = [e for e in entries if Path(e).is_absolute()]
    if not local:
        return None
    files: dict[str, bytes] = {}
    for entry in local:
        files |= _sources(entry)
    return PluginModules(f"flexmarl-plugins-{run_id}", files, tuple(module_name(e) for e in local))


def ship(client: Any, run_id: str, entries: list[str]) -> None:
    """Register the run's plug-ins on every current and future worker of `client`'s cluster,
    then import every entry (installed ones included) on each, so a missing one fails now."""
    plugin = worker_plugin(run_id, entries)
    if plugin is not None:
        client.register_plugin(plugin, name=plugin.name)
    if entries:
        client.run(import_on_worker, tuple(entries))
