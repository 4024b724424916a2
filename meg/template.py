"""Prompt templates: `{question}` plus one `{parent}` placeholder per input node.

We parse placeholders ourselves instead of using `str.format`: node names may contain `@`
(unrolled turns such as `alice@2`), and literal braces in a prompt should not need escaping
beyond `{{`/`}}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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


USER_SLOT = "\x00FLEXMARL-USER\x00"  # a user message no chat template can confuse with text


def chat_frame(tokenizer: Any, system: str | None) -> tuple[str, str]:
    """The text a tokenizer's chat template puts before and after the user message (with
    the generation prompt for the assistant's turn), found by rendering a sentinel message.

    The prompt is then `encode(before) + render_ids(user template) + encode(after)`: the
    user message keeps token-in/token-out (parents spliced as ids) and the framing is
    exactly what `apply_chat_template` writes. Raises `ValueError` when the tokenizer has no
    chat template or its template does not show the user message verbatim."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template (tokenizer_config.json `chat_template`); "
            "remove `chat:` or use an instruct model's tokenizer"
        )
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": USER_SLOT})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    before, found, after = str(text).partition(USER_SLOT)
    if not found or USER_SLOT in after:
        raise ValueError("the tokenizer's chat template does not show the user message as is")
    return before, after


def prompt_ids(
    template: str,
    frame: tuple[Sequence[int], Sequence[int]] | None,
    question: str,
    parents: Mapping[str, Sequence[Sequence[int]]],
    encode: Encode,
    *,
    eos_id: int | None,
    newline_ids: Sequence[int],
) -> list[int]:
    """A node's prompt ids: `render_ids`, inside the chat frame's (before, after) ids when
    the node has `chat:`. Rollout, evaluation and the warm start all call this."""
    ids = render_ids(template, question, parents, encode, eos_id=eos_id, newline_ids=newline_ids)
    if frame is None:
        return ids
    return [*frame[0], *ids, *frame[1]]
