"""The ``snowflake-db`` command. Each sub-command group lives in its own module with a
``register(subparsers)`` function; modules needing extras import them only when run.

Exit statuses, the same for every command: 0 done; 1 the command was right but the database
let it down (unreachable, no worker tables, no worker ID to lease, problems found), with one
line on stderr; 2 a mistake in the command (options, a URL that names no host, database or
existing SQLite file), one line on stderr naming the value. A closed stdout pipe
(``snowflake-db generate -n 1000 | head -1``) ends the command quietly with status 141, as a
process killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..errors import CommandError, SnowflakeError

__all__ = [
    "EXIT_BROKEN_PIPE", "EXIT_FAILURE", "EXIT_USAGE", "CommandError", "build_parser", "main",
]

#: Modules that add sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES = (
    "snowflake_db.cli.ids",
    "snowflake_db.cli.workers",
    "snowflake_db.cli.shards",
    "snowflake_db.cli.doctor",
    "snowflake_db.cli.bench",
    "snowflake_db.cli.public",
)

#: The command was right, the database let it down (see the module's docstring).
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: 128 + SIGPIPE: what a shell reports for a process the closed pipe killed.
EXIT_BROKEN_PIPE = 141


class _Parser(argparse.ArgumentParser):
    """Usage mistakes print one line (not the whole usage) and exit with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("snowflake-db")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="snowflake-db",
        description="Snowflake IDs for database primary keys: decode, generate, manage workers. "
        "Times without a zone (--epoch 2020-01-01) mean UTC.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
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
    command = "?"
    try:
        args = parser.parse_args(argv)
        # A command with actions names the action too, as argparse's usage errors do.
        command = getattr(args, "command_path", args.command)
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except (CommandError, SnowflakeError) as error:
        print(f"snowflake-db {command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (| head): send what is left of stdout to /dev/null so the
        # interpreter's final flush does not raise again, and end like SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
