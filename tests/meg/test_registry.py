"""The one registry type: duplicates refused, unknown names listed, `module:attr` imports."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from meg.registry import META_ATTR, Registry, UnknownNameError


def test_register_get_meta_and_the_duplicate_rule() -> None:
    reg: Registry[Any] = Registry("widget", reserved=("builtin",))
    reg.register("a", "b", colour="red")(len)
    assert reg.get("a") is reg.get("b") is len
    assert reg.meta("b") == {"colour": "red"} and reg.names() == ["a", "b"] == list(reg)
    assert "a" in reg and "z" not in reg
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.add("a", print)
    with pytest.raises(ValueError, match="widget 'builtin' is already registered"):
        reg.add("builtin", print)
    with pytest.raises(UnknownNameError, match=r"unknown widget 'c'; known: a, b$") as err:
        reg.get("c")
    assert isinstance(err.value, KeyError) and str(err.value) == err.value.args[0]


def test_check_runs_on_every_entry() -> None:
    def only_callables(name: str, obj: Any) -> None:
        if not callable(obj):
            raise TypeError(f"{name} is not callable")

    reg: Registry[Any] = Registry("hook", check=only_callables)
    with pytest.raises(TypeError, match="x is not callable"):
        reg.add("x", 3)
    assert "x" not in reg


def test_importable_names_resolve_once_with_their_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_widgets.py").write_text(
        f"def shiny(): return 1\nshiny.{META_ATTR} = {{'colour': 'gold'}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[Any] = Registry("widget", importable=True)
    fn = reg.get("my_widgets:shiny")
    assert fn() == 1 and reg.get("my_widgets:shiny") is fn
    assert reg.meta("my_widgets:shiny") == {"colour": "gold"}
    with pytest.raises(UnknownNameError, match=r"cannot import module 'nowhere'.*plugins:"):
        reg.get("nowhere:x")
    with pytest.raises(UnknownNameError, match="module 'my_widgets' has no attribute 'dull'"):
        reg.get("my_widgets:dull")
    plain: Registry[Any] = Registry("widget")  # not importable: a colon is just a name
    with pytest.raises(UnknownNameError, match="unknown widget 'my_widgets:shiny'"):
        plain.get("my_widgets:shiny")
    sys.modules.pop("my_widgets", None)
