"""Prompt templates: `{question}` plus one `{parent}` placeholder per input node.

We parse placeholders ourselves instead of using `str.format`: node names may contain `@`
(unrolled turns such as `alice@2`), and literal braces in a prompt should not need escaping
beyond `{{`/`}}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

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


Encode = Callable[[str], list[int]]


def render_ids(
    template: str,
    question: str,
    parents: Mapping[str, Sequence[Sequence[int]]],
    encode: Encode,
    *,
    eos_id: int | None,
    newline_ids: Sequence[int],
) -> list[int]:
    """Token ids of `template`: literal text and `{question}` encoded piece by piece, each
    `{parent}` spliced in as the exact token ids that parent sampled (minus a trailing EOS).

    Token-in/token-out: a parent response is never re-tokenized as text (when parent and
    child share a tokenizer; otherwise the caller decodes and re-encodes it first). Several
    samples shown by an aggregate rule (`all`) are joined by `newline_ids`. Rollout,
    evaluation and the supervised warm start all build prompts here, so a model is trained
    on exactly the token sequences it will see.
    """
    out: list[int] = []
    pos = 0
    for m in PLACEHOLDER.finditer(template):
        literal = template[pos : m.start()].replace("{{", "{").replace("}}", "}")
        if literal:
            out += encode(literal)
        name = m.group(1)
        if name == "question":
            out += encode(question)
        else:
            for i, resp in enumerate(parents[name]):
                if i:
                    out += list(newline_ids)
                ids = list(resp)
                if eos_id is not None and ids and ids[-1] == eos_id:
                    ids = ids[:-1]
                out += ids
        pos = m.end()
    tail = template[pos:].replace("{{", "{").replace("}}", "}")
    if tail:
        out += encode(tail)
    return out
