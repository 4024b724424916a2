"""Errors raised for user mistakes in a MEG config.

A `MEGError` is what the CLI turns into a one-paragraph message and exit code 2: it names the
file and the field, states the broken invariant and, where it can, the fix. Never raise it for
programming errors inside the project.
"""

from __future__ import annotations


class MEGError(ValueError):
    """A MEG config is invalid. `source` is the file (or "<memory>"), `field` a dotted path."""

    def __init__(self, message: str, *, source: str = "<memory>", field: str | None = None):
        self.source = source
        self.field = field
        self.detail = message
        where = f"{source}" + (f", field `{field}`" if field else "")
        super().__init__(f"{where}: {message}")
