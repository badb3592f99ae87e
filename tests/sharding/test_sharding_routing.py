"""The shard router: fixed hashes, co-location, remapping, stability and balance at low traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snowflake_db import InvalidArgumentError, InvalidIdError, Layout, SnowflakeGenerator
from snowflake_db.sharding import (
    ForeignIdError,
    ShardingError,
    ShardRouter,
    UnknownShardError,
    id_range_for_time,
    key_hash,
    splitmix64,
)
from snowflake_db.testing import FakeClock

SHARDED = Layout(sequence_bits=8, shard_bits=4)
TARGETS = ["s0", "s1", "s2", "s3"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: chi-square critical value for 15 degrees of freedom at p = 0.001 (16 shards).
CHI2_15_P001 = 37.697


def chi_square(counts: Counter[int], bins: int) -> float:
    total = sum(counts.values())
    expected = total / bins
    return sum((counts.get(b, 0) - expected) ** 2 / expected for b in range(bins))


def test_splitmix64_matches_the_reference_sequence() -> None:
    # SplitMix64 seeded with 0 outputs these three numbers first (Vigna's reference code).
    gamma = 0x9E3779B97F4A7C15
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(gamma) == 0x6E789E6AA1B965F4
    assert splitmix64(2 * gamma % 2**64) == 0x06C45D188009454F


def test_key_hash_is_pinned() -> None:
    # Changing any of these moves every customer to another shard: they must never change.
    assert key_hash("customer-42") == 0x33E0FB1AB541CC2A
    assert key_hash(b"customer-42") == 0x33E0FB1AB541CC2A
    assert key_hash(42) == 0xBDD732262FEB6E95
    assert key_hash(-1) == key_hash(2**64 - 1) == 0xE4D971771B652C20
    assert key_hash(uuid.UUID(int=1)) == 0xBE28C32B13FEBF82


@pytest.mark.parametrize("bad", [True, 1.5, None, 2**64, -(2**63) - 1, object()])
def test_key_hash_rejects_bad_keys(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        key_hash(bad)  # type: ignore[arg-type]


_CHILD = """
import json, sys
from snowflake_db import Layout
from snowflake_db.sharding import ShardRouter
router = ShardRouter(["s0", "s1", "s2", "s3"], layout=Layout(sequence_bits=8, shard_bits=4))
keys = json.loads(sys.argv[1])
print(json.dumps([[router.shard_for_key(k), router.target_for_key(k)] for k in keys]))
"""


def test_routing_is_stable_across_processes_and_hash_seeds() -> None:
    keys: list[object] = [f"customer-{i}" for i in range(50)] + list(range(-5, 50)) + ["ü€"]
    results = []
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": REPO}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(keys)],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        ).stdout
        results.append(json.loads(out))
    router = ShardRouter(TARGETS, layout=SHARDED)
    here = [[router.shard_for_key(k), router.target_for_key(k)] for k in keys]  # type: ignore[arg-type]
    assert results[0] == results[1] == results[2] == here
    # Python's hash() of a str differs between those seeds: the router does not use it.
    assert len({r[0][0] for r in results}) == 1


def test_co_location_orders_of_a_customer_share_its_shard() -> None:
    router = ShardRouter(TARGETS, layout=SHARDED)
    generator = SnowflakeGenerator(3, layout=SHARDED)
    for customer in range(200):
        ids = [router.new_id(key=customer, generator=generator) for _ in range(3)]
        ids += router.new_ids(3, key=customer, generator=generator)
        shard = router.shard_for_key(customer)
        assert {router.shard_of_id(i) for i in ids} == {shard}
        assert {router.target_for_id(i) for i in ids} == {router.target_for_key(customer)}
        assert all(SHARDED.decode(i).shard == shard for i in ids)
        assert ids[:3] == sorted(ids[:3])  # still time-ordered within the worker


@given(st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text() | st.binary())
def test_every_key_lands_on_its_shard(key: int | str | bytes) -> None:
    router = ShardRouter(TARGETS, layout=SHARDED)
    generator = SnowflakeGenerator(9, layout=SHARDED)
    snowflake_id = router.new_id(key=key, generator=generator)
    assert router.shard_of_id(snowflake_id) == router.shard_for_key(key)
    assert 0 <= snowflake_id <= SHARDED.max_id


def test_remapping_moves_one_logical_shard_without_rewriting_ids() -> None:
    router = ShardRouter(TARGETS, layout=SHARDED)
    generator = SnowflakeGenerator(4, layout=SHARDED)
    ids = [router.new_id(generator=generator) for _ in range(500)]
    moved = router.moved(7, "s9")
    assert moved.targets == ("s0", "s1", "s2", "s3", "s9")
    assert moved.shards_on("s9") == [7]
    assert router.target_of_shard(7) == "s3"  # the original is unchanged
    for snowflake_id in ids:
        shard = router.shard_of_id(snowflake_id)
        assert moved.shard_of_id(snowflake_id) == shard
        expected = "s9" if shard == 7 else router.target_for_id(snowflake_id)
        assert moved.target_for_id(snowflake_id) == expected
    explicit = ShardRouter({s: ("hot" if s == 0 else "cold") for s in range(16)}, layout=SHARDED)
    assert explicit.shards_on("hot") == [0]


def test_mixing_mode_routes_by_the_whole_id() -> None:
    router = ShardRouter(TARGETS, logical_shards=64)
    generator = SnowflakeGenerator(1)
    snowflake_id = generator.next_id()
    assert router.shard_of_id(snowflake_id) == splitmix64(snowflake_id) % 64
    assert router.target_for_id(snowflake_id) == TARGETS[splitmix64(snowflake_id) % 64 % 4]
    with pytest.raises(ShardingError, match="shard_bits"):
        router.new_id(key="c1", generator=generator)
    assert router.new_id(generator=generator) > snowflake_id


def test_bad_configuration_and_requests_have_clear_errors() -> None:
    router = ShardRouter(TARGETS, layout=SHARDED)
    with pytest.raises(UnknownShardError, match=r"unknown logical shard 16; .* 0\.\.15"):
        router.target_of_shard(16)
    with pytest.raises(UnknownShardError, match="unknown shard target 'nope'"):
        router.shards_on("nope")
    with pytest.raises(InvalidArgumentError, match=r"missing \[1, 2"):
        ShardRouter({0: "a"}, layout=SHARDED)
    with pytest.raises(InvalidArgumentError, match="disagrees"):
        ShardRouter(TARGETS, layout=SHARDED, logical_shards=8)
    with pytest.raises(InvalidArgumentError):
        ShardRouter([])
    with pytest.raises(ShardingError, match="layout"):
        router.new_id(key=1, generator=SnowflakeGenerator(1))
    with pytest.raises(InvalidIdError):
        router.shard_of_id(-1)


def test_ids_of_another_layout_are_reported() -> None:
    router = ShardRouter(TARGETS, layout=SHARDED)
    twitter = Layout(epoch_ms=1_288_834_974_657)  # an older epoch: its IDs decode to the future
    foreign = SnowflakeGenerator(1, layout=twitter).next_id()
    with pytest.raises(ForeignIdError, match="another layout"):
        router.check_id(foreign)
    with pytest.raises(ForeignIdError):
        router.check_id(2**63)
    own = SnowflakeGenerator(1, layout=SHARDED).next_id()
    assert router.check_id(own) == own


def test_time_window_is_an_id_range_on_every_shard() -> None:
    clock = FakeClock(step_ms=0)
    router = ShardRouter(TARGETS, layout=SHARDED)
    generator = SnowflakeGenerator(2, layout=SHARDED, clock=clock)
    start = datetime.fromtimestamp(clock.now_ms / 1000, tz=UTC)
    before = [router.new_id(shard=s, generator=generator) for s in range(16)]
    clock.advance(60_000)
    inside = [router.new_id(shard=s, generator=generator) for s in range(16)]
    clock.advance(60_000)
    after = [router.new_id(shard=s, generator=generator) for s in range(16)]
    low, high = router.id_range(start + timedelta(seconds=30), start + timedelta(seconds=90))
    assert (low, high) == id_range_for_time(SHARDED, clock.now_ms - 90_000, clock.now_ms - 30_000)
    assert all(low <= i <= high for i in inside)
    assert not any(low <= i <= high for i in before + after)
    with pytest.raises(InvalidArgumentError, match="before it starts"):
        router.id_range(start + timedelta(seconds=9), start)


def test_low_traffic_id_mod_n_is_skewed_and_the_router_is_not() -> None:
    """10k IDs at one ID per tick: the sequence is 0 every time, so ``id % 16`` is constant."""
    generator = SnowflakeGenerator(5, clock=FakeClock(step_ms=1))
    ids = [generator.next_id() for _ in range(10_000)]
    naive = Counter(i % 16 for i in ids)
    router = ShardRouter([f"s{i}" for i in range(16)], logical_shards=16)
    mixed = Counter(router.shard_of_id(i) for i in ids)
    assert chi_square(naive, 16) > 100 * CHI2_15_P001
    assert chi_square(mixed, 16) < CHI2_15_P001

    # With shard bits: keyless IDs place themselves by mix, customers by their hash.
    sharded = ShardRouter(TARGETS, layout=SHARDED)
    generator = SnowflakeGenerator(5, layout=SHARDED, clock=FakeClock(step_ms=1))
    embedded = Counter(sharded.shard_of_id(sharded.new_id(generator=generator))
                       for _ in range(10_000))
    assert chi_square(embedded, 16) < CHI2_15_P001
    customers = Counter(sharded.shard_for_key(c) for c in range(1, 10_001))
    assert chi_square(customers, 16) < CHI2_15_P001
