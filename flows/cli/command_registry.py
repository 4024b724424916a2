"""The registry of `flexmarl` subcommands: each command module adds its own with `@command`.

It sits below the command modules and `flows.cli.main` (which imports them all, the one place
where they are registered), so that no command module imports the parser that imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from meg.errors import MEGError
from meg.registry import Registry

USER_ERRORS: tuple[type[BaseException], ...] = (MEGError, FileNotFoundError)


@dataclass(frozen=True, slots=True)
class Command:
    name: tuple[str, ...]
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: Registry[Command] = Registry("command")


def command(
    name: str, help: str, configure: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    def deco(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.add(name, Command(tuple(name.split()), help, configure, fn))
        return fn

    return deco
