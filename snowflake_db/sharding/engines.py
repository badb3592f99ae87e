"""The partition a database engine picks for a BIGINT value, computed in Python.

Routing with these functions puts a customer's rows on the backend the engine itself would choose,
so the application knows the owner before it connects. Standard library only; every function is
checked row by row against real servers in ``tests/sharding/test_sharding_engines.py``.

* :func:`postgres_hash_partition` -- PostgreSQL ``PARTITION BY HASH (col)`` on a ``bigint`` (or
  ``integer``: both hash alike for values in the int4 range), also postgres_fdw shards behind such
  partitions. PostgreSQL hashes the value with ``hashint8extended(value, HASH_PARTITION_SEED)``,
  combines it with ``hash_combine64(0, h)`` (``compute_partition_hash_value``, partbounds.c) and
  sends the row to the partition whose ``REMAINDER`` is ``row_hash % MODULUS`` (unsigned 64-bit).
* :func:`mariadb_key_partition` -- MariaDB (and Spider, which routes through the same partitioning
  code) ``PARTITION BY [LINEAR] KEY (col)`` on a ``BIGINT``: ``calculate_key_hash_value`` runs the
  collation hash (``my_hash_sort_simple``) over the column's 8 little-endian bytes. Numeric fields
  hash with the latin1_swedish_ci collation, so each byte goes through its sort order and trailing
  bytes that weigh like a space are dropped; a plain byte hash misplaces about a third of rows.
  ``ALGORITHM=1`` (MySQL 5.1 tables) hashes the raw bytes instead.
* :func:`mariadb_hash_partition` -- ``PARTITION BY [LINEAR] HASH (col)``: ``abs(col % n)``.
* :func:`citus_shard_index` -- Citus's shard of a ``bigint`` distribution column: ``hashint8``
  (32-bit) placed in ``shard_count`` equal ranges of the int32 space. Checked against PostgreSQL's
  own ``hashint8()``, not against a Citus cluster.
"""

from __future__ import annotations

from collections.abc import Callable

from .._validate import require_int

BIGINT_MIN = -(1 << 63)
BIGINT_MAX = (1 << 63) - 1
#: PostgreSQL stores MODULUS as int4 and requires it positive.
POSTGRES_MAX_MODULUS = (1 << 31) - 1
#: MariaDB's MAX_PARTITIONS (partitions and subpartitions of one table).
MARIADB_MAX_PARTITIONS = 8192
#: Citus's MAX_SHARD_COUNT.
CITUS_MAX_SHARD_COUNT = 64000

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1

# -- PostgreSQL: Jenkins lookup3 as in src/common/hashfn.c ----------------------------------

#: HASH_PARTITION_SEED (src/include/catalog/partition.h).
POSTGRES_HASH_PARTITION_SEED = 0x7A5B22367996DCFD
_COMBINE = 0x49A0F4DD15E5A8E3  # hash_combine64's constant
_INIT = (0x9E3779B9 + 4 + 3923095) & _M32  # lookup3's start for one uint32 key


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _M32
    a ^= _rot(c, 4)
    c = (c + b) & _M32
    b = (b - a) & _M32
    b ^= _rot(a, 6)
    a = (a + c) & _M32
    c = (c - b) & _M32
    c ^= _rot(b, 8)
    b = (b + a) & _M32
    a = (a - c) & _M32
    a ^= _rot(c, 16)
    c = (c + b) & _M32
    b = (b - a) & _M32
    b ^= _rot(a, 19)
    a = (a + c) & _M32
    c = (c - b) & _M32
    c ^= _rot(b, 4)
    b = (b + a) & _M32
    return a, b, c


def _start(seed: int) -> tuple[int, int, int]:
    """lookup3's state after absorbing a 64-bit seed (hash_bytes_uint32_extended)."""
    if seed == 0:
        return _INIT, _INIT, _INIT
    return _mix((_INIT + (seed >> 32)) & _M32, (_INIT + seed) & _M32, _INIT)


def _final(a: int, b: int, c: int) -> tuple[int, int]:
    """lookup3's final(): returns (b, c), the two words PostgreSQL reads."""
    c = ((c ^ b) - (((b << 14) | (b >> 18)) & _M32)) & _M32
    a = ((a ^ c) - (((c << 11) | (c >> 21)) & _M32)) & _M32
    b = ((b ^ a) - (((a << 25) | (a >> 7)) & _M32)) & _M32
    c = ((c ^ b) - (((b << 16) | (b >> 16)) & _M32)) & _M32
    a = ((a ^ c) - (((c << 4) | (c >> 28)) & _M32)) & _M32
    b = ((b ^ a) - (((a << 14) | (a >> 18)) & _M32)) & _M32
    c = ((c ^ b) - (((b << 24) | (b >> 8)) & _M32)) & _M32
    return b, c


_PART_A, _PART_B, _PART_C = _start(POSTGRES_HASH_PARTITION_SEED)


def _fold(value: int) -> int:
    """hashint8's fold of the high word into the low one, so int4 and int8 hash alike."""
    high = (value >> 32) & _M32
    return (value & _M32) ^ (high if value >= 0 else high ^ _M32)


def _bigint(value: object) -> int:
    if value.__class__ is int and BIGINT_MIN <= value <= BIGINT_MAX:
        return value
    return require_int(
        "value", value, minimum=BIGINT_MIN, maximum=BIGINT_MAX,
        limit_note="a signed 64-bit BIGINT",
    )


def hashint8extended(value: int, seed: int) -> int:
    """PostgreSQL's ``hashint8extended(value, seed)``, as the signed bigint it returns."""
    a, b, c = _start(require_int("seed", seed, minimum=BIGINT_MIN, maximum=_M64) & _M64)
    high, low = _final((a + _fold(_bigint(value))) & _M32, b, c)
    result = (high << 32) | low
    return result - (1 << 64) if result > BIGINT_MAX else result


def hashint8(value: int) -> int:
    """PostgreSQL's 32-bit ``hashint8(value)``, as the signed int4 it returns (Citus hashes so)."""
    _, low = _final((_INIT + _fold(_bigint(value))) & _M32, _INIT, _INIT)
    return low - (1 << 32) if low > 0x7FFFFFFF else low


def postgres_hash_partition(value: int, modulus: int) -> int:
    """The ``REMAINDER`` of the partition PostgreSQL picks for ``value`` among
    ``PARTITION BY HASH`` partitions ``WITH (MODULUS modulus, ...)`` on a bigint column.

    With mixed moduli (PostgreSQL requires each to divide the next) a row lands in the partition
    whose remainder equals this function for that partition's modulus.
    """
    value = _bigint(value)
    if not (modulus.__class__ is int and 1 <= modulus <= POSTGRES_MAX_MODULUS):
        modulus = require_int("modulus", modulus, minimum=1, maximum=POSTGRES_MAX_MODULUS,
                              limit_note="PostgreSQL's MODULUS is a positive int4")
    high, low = _final((_PART_A + _fold(value)) & _M32, _PART_B, _PART_C)
    return ((((high << 32) | low) + _COMBINE) & _M64) % modulus


def citus_shard_index(value: int, shard_count: int) -> int:
    """The index (0-based, in shard-range order) of the Citus shard holding ``value``: Citus
    splits the int32 hash space into ``shard_count`` equal ranges, the last one taking the
    rest. Untested against Citus itself; ``hashint8`` is checked against PostgreSQL's."""
    shard_count = require_int("shard_count", shard_count, minimum=1,
                              maximum=CITUS_MAX_SHARD_COUNT, limit_note="Citus's shard limit")
    index = (hashint8(value) + (1 << 31)) // ((1 << 32) // shard_count)
    return min(index, shard_count - 1)


# -- MariaDB --------------------------------------------------------------------------------

#: latin1_swedish_ci's sort order (``sort_order`` in strings/ctype-latin1.c), derived from a
#: MariaDB 10.11 server: byte n weighs ``WEIGHT_STRING(CONVERT(CHAR(n) USING latin1) COLLATE
#: latin1_swedish_ci)`` (one byte each). tests/sharding/test_sharding_engines.py re-derives it live.
LATIN1_SWEDISH_CI_SORT_ORDER = bytes.fromhex(
    "000102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F"
    "202122232425262728292A2B2C2D2E2F303132333435363738393A3B3C3D3E3F"
    "404142434445464748494A4B4C4D4E4F505152535455565758595A5B5C5D5E5F"
    "604142434445464748494A4B4C4D4E4F505152535455565758595A7B7C7D7E7F"
    "808182838485868788898A8B8C8D8E8F909192939495969798999A9B9C9D9E9F"
    "A0A1A2A3A4A5A6A7A8A9AAABACADAEAFB0B1B2B3B4B5B6B7B8B9BABBBCBDBEBF"
    "414141415C5B5C434545454549494949444E4F4F4F4F5DD7D85555555959DEDF"
    "414141415C5B5C434545454549494949444E4F4F4F4F5DF7D85555555959DEFF"
)
_SPACE_WEIGHT = LATIN1_SWEDISH_CI_SORT_ORDER[0x20]
_BINARY_ORDER = bytes(range(256))


def _key_hash(value: int, order: bytes, trim: bool) -> int:
    """(uint32) nr1 after MariaDB's hash_sort over the 8 little-endian bytes of ``value``.

    MY_HASH_ADD: ``nr1 ^= ((nr1 & 63) + nr2) * weight + (nr1 << 8); nr2 += 3`` from nr1=1,
    nr2=4, in 64-bit ``ulong``; every step keeps low bits from low bits, so 32 bits suffice.
    """
    data = (value & _M64).to_bytes(8, "little")
    end = 8
    if trim:
        while end and order[data[end - 1]] == _SPACE_WEIGHT:
            end -= 1
    nr1, nr2 = 1, 4
    for byte in data[:end]:
        nr1 = (nr1 ^ (((nr1 & 63) + nr2) * order[byte] + (nr1 << 8))) & _M32
        nr2 += 3
    return nr1


def _partitions(partitions: object) -> int:
    if partitions.__class__ is int and 1 <= partitions <= MARIADB_MAX_PARTITIONS:
        return partitions
    return require_int("partitions", partitions, minimum=1, maximum=MARIADB_MAX_PARTITIONS,
                       limit_note="MariaDB's MAX_PARTITIONS")


def _linear(hashed: int, partitions: int) -> int:
    """get_part_id_from_linear_hash: mask by the next power of two, halve it if too big."""
    mask = (1 << (partitions - 1).bit_length()) - 1
    part = hashed & mask
    return part if part < partitions else hashed & (mask >> 1)


def mariadb_key_partition(
    value: int, partitions: int, *, algorithm: int = 2, linear: bool = False
) -> int:
    """The partition index (``p<index>``) MariaDB and Spider pick for ``value`` in a table
    ``PARTITION BY [LINEAR] KEY [ALGORITHM=algorithm] (col) PARTITIONS partitions`` whose
    partitioning column is a ``BIGINT``."""
    value = _bigint(value)
    partitions = _partitions(partitions)
    if algorithm == 2 and algorithm.__class__ is int:
        hashed = _key_hash(value, LATIN1_SWEDISH_CI_SORT_ORDER, True)
    else:
        require_int("algorithm", algorithm, minimum=1, maximum=2,
                    limit_note="MariaDB's KEY ALGORITHM is 1 or 2")
        hashed = _key_hash(value, _BINARY_ORDER, False)
    return _linear(hashed, partitions) if linear else hashed % partitions


def mariadb_hash_partition(value: int, partitions: int, *, linear: bool = False) -> int:
    """The partition index MariaDB picks for ``PARTITION BY [LINEAR] HASH (col)`` on a BIGINT:
    ``abs(col % partitions)`` with C's truncating ``%`` (the linear form masks ``col``)."""
    value = _bigint(value)
    partitions = _partitions(partitions)
    if linear:
        return _linear(value & _M64, partitions)
    return abs(value) % partitions


#: The ``ShardRouter(engine=...)`` names and the partition function each one routes with.
ROUTING_ENGINES: dict[str, Callable[[int, int], int]] = {
    "postgresql-hash": postgres_hash_partition,
    "mariadb-key": mariadb_key_partition,
    "mariadb-hash": mariadb_hash_partition,
}
