"""Conditions of `when:` and of a loop's `until:`: does an invocation run?

A condition reads one shown sample of an input node: its text (decoded as the reward
functions see it) and whether a tool marked it terminal. It is a pure function of those and
its params, evaluated in the generate task before anything is sampled, so a skipped
invocation costs no decode. Plug-ins add their own with `@register_condition("name")`;
`module:function` names work too.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from meg.registry import Registry

Condition = Callable[..., bool]  # (sample text, terminal, **params) -> bool
CONDITIONS: Registry[Condition] = Registry("condition", importable=True)


def register_condition(name: str) -> Callable[[Condition], Condition]:
    return CONDITIONS.register(name)


@register_condition("contains")
def contains(sample: str, terminal: bool, *, text: str) -> bool:
    """The sample's text contains `params.text` (case-insensitive)."""
    return bool(text) and text.lower() in sample.lower()


@register_condition("matches")
def matches(sample: str, terminal: bool, *, pattern: str) -> bool:
    """A regular expression `pattern` matches somewhere in the sample's text."""
    return re.search(pattern, sample) is not None


@register_condition("terminal")
def terminal(sample: str, terminal: bool) -> bool:
    """A tool marked the sample terminal (e.g. every test passed)."""
    return terminal


def params_problem(name: str, params: Mapping[str, Any]) -> str | None:
    """Why condition `name` cannot take `params` (None: it can). Raises the registry's
    error for an unknown name."""
    fn = CONDITIONS.get(name)
    try:
        inspect.signature(fn).bind("", False, **params)
    except TypeError as e:
        return f"condition {name!r} cannot take params {dict(params)}: {e}"
    if name == "contains" and not (isinstance(params["text"], str) and params["text"]):
        return "`contains` needs a non-empty string `text`"
    if name == "matches" and not isinstance(params["pattern"], str):
        return f"`matches` needs a string `pattern`, got {params['pattern']!r}"
    if name == "matches":
        try:
            re.compile(str(params["pattern"]))
        except re.error as e:
            return f"`matches`: pattern {params['pattern']!r} is not a regular expression ({e})"
    return None


def holds(name: str, params: Mapping[str, Any], text: str, is_terminal: bool) -> bool:
    return bool(CONDITIONS.get(name)(text, is_terminal, **params))
