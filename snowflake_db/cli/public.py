"""``snowflake-db public encode|decode|new-key``: public numbers for support staff.

The keys come from the ``SNOWFLAKE_DB_PUBLIC_ID_KEYS`` environment variable (never from the
command line, where they would land in the shell's history). A number that is refused
(mistyped, another key or namespace, unknown key version) is a mistake in the input: one line
on stderr naming it and the reason, exit status 2, and nothing on stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from ..errors import CommandError


def _texts(arguments: list[str]) -> Iterator[str]:
    """The arguments, ``-`` standing for the lines read from stdin (one value per line:
    a number may be typed with spaces)."""
    for argument in arguments:
        if argument == "-":
            yield from (line.strip() for line in sys.stdin if line.strip())
        else:
            yield argument


def _encode(args: argparse.Namespace) -> int:
    from ..public_ids import codec_for

    codec = codec_for(args.namespace)
    numbers = []
    for text in _texts(args.values):
        stripped = text.strip()
        if not stripped.isascii() or not stripped.isdigit():
            raise CommandError(f"{text!r} is not a decimal Snowflake ID")
        numbers.append(codec.encode(int(stripped), group=args.group))
    if not numbers:
        raise CommandError("no ID given (on stdin for 'encode -')")
    print("\n".join(numbers))
    return 0


def _decode(args: argparse.Namespace) -> int:
    from ..public_ids import codec_for

    codec = codec_for(args.namespace)
    keys = [codec.decode(text) for text in _texts(args.values)]  # PublicIdError: exit 2
    if not keys:
        raise CommandError("no number given (on stdin for 'decode -')")
    print("\n".join(map(str, keys)))
    return 0


def _new_key(args: argparse.Namespace) -> int:
    from ..public_ids import ENV_VAR, generate_key

    print(generate_key(args.version))
    print(
        f"# put it in {ENV_VAR} (or SNOWFLAKE_DB['PUBLIC_ID_KEYS']); to rotate, append it with "
        "a higher version after the current entry: '1:<old>,2:<new>'",
        file=sys.stderr,
    )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    public = subparsers.add_parser(
        "public",
        help="public numbers: encode IDs, decode numbers, make a key "
        "(keys from $SNOWFLAKE_DB_PUBLIC_ID_KEYS)",
    )
    commands = public.add_subparsers(dest="public_command", required=True, metavar="ACTION",
                                     parser_class=type(public))
    encode = commands.add_parser("encode", help="the public numbers of Snowflake IDs")
    encode.add_argument("values", nargs="+", metavar="ID", help="decimal IDs; - reads stdin")
    encode.add_argument("--namespace", required=True, metavar="NS",
                        help="what the numbers count, e.g. orders (part of the key: decode "
                        "needs the same one)")
    encode.add_argument("--group", type=int, default=None, metavar="N",
                        help="hyphen every N symbols for display (e.g. 4)")
    encode.set_defaults(handler=_encode, command_path="public encode")

    decode = commands.add_parser("decode", help="the Snowflake IDs of public numbers")
    decode.add_argument("values", nargs="+", metavar="NUMBER",
                        help="public numbers (any case, hyphens allowed); - reads stdin")
    decode.add_argument("--namespace", required=True, metavar="NS",
                        help="the namespace the numbers were made for, e.g. orders")
    decode.set_defaults(handler=_decode, command_path="public decode")

    new_key = commands.add_parser("new-key", aliases=["generate-key"],
                                  help="print a new random key in the environment's format")
    new_key.add_argument("--version", type=int, default=1, metavar="V",
                         help="key version 0-31 (default 1; rotate with a higher one)")
    new_key.set_defaults(handler=_new_key, command_path="public new-key")
