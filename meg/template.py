"""Prompt templates: `{question}` plus one `{parent}` placeholder per input node.

We parse placeholders ourselves instead of using `str.format`: node names may contain `@`
(unrolled turns such as `alice@2`), and literal braces in a prompt should not need escaping
beyond `{{`/`}}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_@\-]*)\}(?!\})")
RESERVED = ("question",)


def placeholders(template: str) -> tuple[str, ...]:
    """Names used in `template`, in first-use order, without duplicates."""
    seen: dict[str, None] = {}
    for m in PLACEHOLDER.finditer(template):
        seen.setdefault(m.group(1), None)
    return tuple(seen)


def render(template: str, values: Mapping[str, str]) -> str:
    """Substitute every placeholder; a missing value is a KeyError naming it."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise KeyError(f"template placeholder {{{name}}} has no value")
        return values[name]

    return PLACEHOLDER.sub(sub, template).replace("{{", "{").replace("}}", "}")


def static_text(template: str) -> str:
    """The template with its placeholders removed (to estimate its own prompt length)."""
    return PLACEHOLDER.sub("", template)
