"""Prompt token ids from a node template, splicing parent responses as token ids.

Token-in/token-out: a parent's response enters the child's prompt as the exact token ids it
sampled (minus a trailing EOS), not as text re-tokenized, whenever parent and child share a
tokenizer. Only the template's own text and the question are tokenized here. When the
tokenizers differ, the parent text is decoded and re-encoded — the only correct option then.
Several samples shown by an aggregate rule (`all`) are joined with a newline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from meg.template import PLACEHOLDER

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
    """Token ids of `template` with `{question}` encoded and each `{parent}` spliced in."""
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
