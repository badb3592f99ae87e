"""Public order numbers in the demo: what a customer sees instead of the order's key.

The key (a Snowflake ID) tells anyone when the order was made and how busy the shop is; the
public number (:mod:`snowflake_db.public_ids`) tells nothing without the shop's secret key and
refuses a mistyped symbol. Keys come from ``SNOWFLAKE_DB_PUBLIC_ID_KEYS``; without it the demo
makes a throwaway key for this run (children inherit it through the environment).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.util import find_spec

from .common import Checks

NAMESPACE = "orders"


def ensure_demo_key() -> None:
    """Use ``SNOWFLAKE_DB_PUBLIC_ID_KEYS``, or set a throwaway key for this run and say so."""
    from snowflake_db.public_ids import ENV_VAR, generate_key

    if os.environ.get(ENV_VAR):
        return
    os.environ[ENV_VAR] = generate_key()
    print(f"  note: {ENV_VAR} is not set, so this run uses a throwaway key: public order "
          "numbers change with every run. Keep one with\n"
          f"        export {ENV_VAR}=$(snowflake-db public new-key)")


def mistyped(number: str) -> str:
    """``number`` with one symbol changed, as a customer reading it out might."""
    position = 6 if number[6] != "-" else 7
    wrong = "7" if number[position] not in "7" else "8"
    return number[:position] + wrong + number[position + 1:]


def swapped(number: str) -> str:
    """``number`` with the first two different neighbouring symbols swapped."""
    plain = number.replace("-", "")
    i = next(i for i in range(len(plain) - 1) if plain[i] != plain[i + 1])
    plain = plain[:i] + plain[i + 1] + plain[i] + plain[i + 2:]
    return "-".join(plain[j:j + 4] for j in range(0, len(plain), 4))


def check_public_numbers(
    checks: Checks, key: int, find: Callable[[str], tuple[int | None, int]]
) -> None:
    """What a customer sees, found again by ``find(number) -> (key or None, shards queried)``;
    a mistyped or swapped number finds nothing and says why."""
    if find_spec("cryptography") is None:  # the codec's AES; `make demo` installs it
        print("  [skipped] public order numbers: cryptography is not installed "
              "(pip install 'snowflake-db[public-ids]')")
        return
    from snowflake_db.errors import PublicIdError
    from snowflake_db.public_ids import codec_for

    codec = codec_for(NAMESPACE)
    number = codec.encode(key, group=4)
    print(f"order confirmation: \"Your order number is {number}\" (the key {key} stays "
          "in the database)")
    found, shards = find(number)
    checks.check(found == key, f"order number {number} finds order {key} "
                 f"(querying {shards} shard{'s' if shards != 1 else ''})")
    for label, wrong in (("mistyped", mistyped(number)), ("swapped", swapped(number))):
        try:
            codec.decode(wrong)
            reason = "decoded!"
        except PublicIdError as error:
            reason = str(error).split(": ", 1)[-1] if error.reason == "check" else error.reason
        found, _ = find(wrong)
        checks.check(found is None and reason != "decoded!",
                     f"{label} number {wrong} is refused ({reason}); no order found")
