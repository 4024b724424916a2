"""The base of every block of a MEG file: frozen (a spec is a value), unknown keys refused.

Forbidding unknown keys is what turns a typo (`max_token:`) into an error that names the field
instead of a silently ignored setting."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def flag_block(model: type[Frozen], v: Any) -> Any:
    """An optional block written as a flag: `true` is every default of `model`, `false` is
    off (None); anything else is validated as the block."""
    if v is True:
        return model()
    return None if v is False else v
