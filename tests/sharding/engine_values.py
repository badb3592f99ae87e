"""The BIGINT values the engine-routing tests place, on a server or through Spider: edges,
random 64-bit values, Snowflake IDs, customer IDs and bytes that weigh like a space in latin1."""

from __future__ import annotations

import random

from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.sharding import engines as e

SPACEY = [  # bytes 0x20 (latin1's space weight) at the top of the little-endian image
    0x20, 0x2020, 0x20 << 56, 0x2020 << 48, 0x2020202020202020, 0x2020202020202000,
    0x2000000000000020, 0x2100000000000000, -0x2020202020202021, -(0x5F << 56),
]


def engine_values() -> list[int]:
    rng = random.Random(19)
    edges = [0, 1, -1, 2, -2, 42, e.BIGINT_MAX, e.BIGINT_MIN, e.BIGINT_MAX - 1, e.BIGINT_MIN + 1]
    edges += [s * 2**k + d for k in (31, 32, 53, 62) for s in (1, -1) for d in (-1, 0, 1)]
    layout = Layout(sequence_bits=8, shard_bits=4)
    snowflakes = SnowflakeGenerator(7).next_ids(400)
    snowflakes += SnowflakeGenerator(3, layout=layout).next_ids(200)
    customers = list(range(1, 1001))
    random64 = [rng.randrange(e.BIGINT_MIN, e.BIGINT_MAX + 1) for _ in range(1200)]
    random32 = [rng.randrange(-(2**31), 2**31) for _ in range(300)]
    values = edges + SPACEY + snowflakes + customers + random64 + random32
    return list(dict.fromkeys(values))


VALUES = engine_values()
