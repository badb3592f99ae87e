"""The ``snowflake-db`` command. Each sub-command group lives in its own module with a
``register(subparsers)`` function; modules needing extras import them only when run."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..errors import SnowflakeError

#: Modules that add sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES = ("snowflake_db.cli.ids", "snowflake_db.cli.workers", "snowflake_db.cli.bench")

EXIT_USAGE = 2


class CommandError(Exception):
    """A problem to report on one line of stderr, with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """Usage mistakes print one line (not the whole usage) and exit with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="snowflake-db",
        description="Snowflake IDs for database primary keys: decode, generate, manage workers.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                continue  # a command group not shipped in this build
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (CommandError, SnowflakeError) as error:
        print(f"snowflake-db {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
