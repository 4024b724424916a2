"""Tokenizers by path, loaded once per process, and the two questions prompting asks of them.

Torch-free, so the driver can check a chat template without the model stack
(`flows.runs.config.check_chat`). `same_tokenizer` is the one rule for splicing a parent's
token ids into a child's prompt (`engines.rollout.prompts`): by the tokenizer files' content,
since a run's exports are different directories holding copies of one tokenizer, and
decoding and re-encoding is not lossless on an untrained model's output.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

from engines.model_files import local_dir

# The files that make up a Hugging Face tokenizer (copied beside every exported model).
TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt"
    r"|.*\.model|chat_template.*)$"
)


@functools.lru_cache(maxsize=32)
def tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer of a local directory or hub name (`AgentSpec.tokenizer_path`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_dir(path))


@functools.lru_cache(maxsize=4096)
def encode(path: str, text: str) -> tuple[int, ...]:
    """`text`'s ids under the tokenizer at `path`, without special tokens."""
    return tuple(tokenizer(path)(text, add_special_tokens=False)["input_ids"]) if text else ()


@functools.lru_cache(maxsize=64)
def chat_frame_ids(path: str, system: str | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (before, after) ids the tokenizer's chat template puts around a user message."""
    from meg.template import chat_frame

    before, after = chat_frame(tokenizer(path), system)
    return encode(path, before), encode(path, after)


def chat_frame_of(node: Any, tok_path: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The chat frame of a `chat:` node's prompts; None for a plain-template node."""
    return None if node.chat is None else chat_frame_ids(tok_path, node.chat.system)


@functools.lru_cache(maxsize=32)
def tokenizer_identity(path: str) -> str:
    """Content hash of a directory's tokenizer files (else the path itself: a hub name)."""
    p = Path(local_dir(path))
    files = sorted(f for f in p.iterdir() if TOKENIZER_FILES.match(f.name)) if p.is_dir() else []
    if not files:
        return path
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def same_tokenizer(a: str, b: str) -> bool:
    return a == b or tokenizer_identity(a) == tokenizer_identity(b)
