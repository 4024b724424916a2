"""The prompt of one node invocation, from its template, its task and its parents' answers.

One function for training rollouts (`tasks.rollout.plan_prompts`, parents read from the
store) and for evaluation (`flows.evaluate`, parents generated in the same pass), so both
prompt a model exactly alike. A parent's answer is spliced as token ids when parent and child
share a tokenizer (`engines.tokenizers.same_tokenizer`); otherwise text is the only common
ground, and the ids are decoded and re-encoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from engines.tokenizers import chat_frame_of, encode, same_tokenizer, tokenizer
from meg.template import prompt_ids

# (parent node, the parent's tokenizer path, the token ids of each answer shown)
ParentAnswers = tuple[str, str, Sequence[Sequence[int]]]


def shown_inputs(tok_path: str, parents: Iterable[ParentAnswers]) -> dict[str, list[list[int]]]:
    """Parent node → its answers as ids of the child's tokenizer."""
    shown: dict[str, list[list[int]]] = {}
    for parent, parent_tok, answers in parents:
        if same_tokenizer(parent_tok, tok_path):
            shown[parent] = [list(a) for a in answers]
            continue
        decode = tokenizer(parent_tok).decode
        shown[parent] = [
            list(encode(tok_path, decode(a, skip_special_tokens=True))) for a in answers
        ]
    return shown


def invocation_prompt(
    node: Any, tok_path: str, question: str, parents: Iterable[ParentAnswers]
) -> list[int]:
    """Prompt ids of one invocation of `node` (a `NodeSpec`) on `question`."""
    return prompt_ids(
        node.template,
        chat_frame_of(node, tok_path),
        question,
        shown_inputs(tok_path, parents),
        lambda text: list(encode(tok_path, text)),
        eos_id=tokenizer(tok_path).eos_token_id,
        newline_ids=list(encode(tok_path, "\n")),
    )
