"""The `flexmarl` command line: thin argparse front-ends over the flows and engines.

User mistakes (a bad config, a missing model, a bad store URL) exit with code 2 and one
paragraph on stderr, never a traceback. Each subcommand is registered once with `@command`
(`flows.cli.command_registry`) in the modules imported below, the one place that lists them; the
parser is built from that registry, so there is no second dispatch on the name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flows.cli import commands, models
from flows.cli.command_registry import COMMANDS, USER_ERRORS

COMMAND_MODULES = (commands, models)  # every module that registers commands: the one list


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the user asked for something wrong" (exit 2, no traceback)."""
    return USER_ERRORS + commands.EXTRA_USER_ERRORS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flexmarl",
        description="Multi-agent LLM reinforcement learning as Prefect flows on Dask.",
    )
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for cmd in (COMMANDS.get(n) for n in COMMANDS):
        target = subs
        if len(cmd.name) == 2:
            group = cmd.name[0]
            if group not in groups:
                gp = subs.add_parser(group, help=f"{group} commands")
                groups[group] = gp.add_subparsers(dest="subcommand", required=True, metavar="SUB")
            target = groups[group]
        p = target.add_parser(cmd.name[-1], help=cmd.help, description=cmd.help)
        cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except user_error_types() as e:
        print(f"flexmarl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("flexmarl: interrupted", file=sys.stderr)
        return 130
