"""Command-line flags generated from the pydantic parameter models: one source of truth.

`TrainParams` (with its nested `ClusterConfig`) and `EvalParams` are what a deployment's UI
form, a Python caller and the CLI all fill in; the flags are derived from their fields, so a
new field is a new flag, with its `description` as help text and its default shown once:

- `foo_bar: int | None` → `--foo-bar N`; a `Literal[...]` field → `choices`;
- `flag: bool = False` → `--flag`; `flag: bool = True` → `--no-flag`; `flag: bool | None`
  (an override of a MEG setting) → `--flag` / `--no-flag`;
- fields generated from another model keep its bounds and description: `TrainParams`' run
  settings are `RunSpec`'s (`flows.runs.resolve.override_fields`), refused out of bounds by
  the same validation;
- a nested model's fields are flattened (`cluster.train_slots` → `--train-slots`);
- `json_schema_extra={"cli": "--json"}` renames a flag, `{"cli": None}` hides a field;
  `positional=("config",)` makes a field an optional positional argument.

Flags that are not given are not passed to the model, so its defaults apply: argparse never
holds a second copy of them.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

_UNSET = argparse.SUPPRESS


def _unwrap(annotation: Any) -> Any:
    """`X | None` → X, `Annotated[X, bounds...]` → X (the bounds are the model's to check)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:
        return typing.get_args(annotation)[0]
    return annotation


def _flag(name: str, info: FieldInfo) -> str | None:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "cli" in extra:
        cli = extra["cli"]
        return None if cli is None else str(cli)
    return "--" + name.replace("_", "-")


def _help(info: FieldInfo) -> str:
    text = info.description or ""
    if not info.is_required() and info.default is not None and info.default_factory is None:
        shown = info.default
        text = f"{text} (default: {shown})" if text else f"default: {shown}"
    return text.replace("%", "%%")


def add_model_args(
    parser: argparse.ArgumentParser, model: type[BaseModel], positional: tuple[str, ...] = ()
) -> None:
    """Add one flag per field of `model` (nested models flattened)."""
    for name, info in model.model_fields.items():
        kind = _unwrap(info.annotation)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            add_model_args(parser, kind)
            continue
        if name in positional:
            parser.add_argument(name, nargs="?", default=_UNSET, help=info.description)
            continue
        flag = _flag(name, info)
        if flag is None:
            continue
        if kind is bool:
            if info.default is None:  # an override of a MEG setting: both ways
                parser.add_argument(
                    flag,
                    dest=name,
                    action=argparse.BooleanOptionalAction,
                    default=_UNSET,
                    help=_help(info) or f"{name} (default: the MEG's)",
                )
            elif info.default is True:
                parser.add_argument(
                    "--no-" + flag.removeprefix("--"),
                    dest=name,
                    action="store_false",
                    default=_UNSET,
                    help=f"turn off: {info.description or name}",
                )
            else:
                parser.add_argument(
                    flag, dest=name, action="store_true", default=_UNSET, help=info.description
                )
            continue
        kw: dict[str, Any] = {"dest": name, "default": _UNSET, "help": _help(info)}
        if typing.get_origin(kind) is Literal:
            kw["choices"] = list(typing.get_args(kind))
        elif kind in (int, float):
            kw["type"] = kind
            kw["metavar"] = "N" if kind is int else "X"
        parser.add_argument(flag, **kw)


def model_from_args(model: type[BaseModel], args: argparse.Namespace) -> Any:
    """The `model` instance of the flags given (raises pydantic's `ValidationError`)."""
    given = vars(args)
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        kind = _unwrap(info.annotation)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            fields[name] = model_from_args(kind, args)
        elif name in given:
            fields[name] = given[name]
    return model(**fields)
