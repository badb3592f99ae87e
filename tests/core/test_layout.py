"""Layout: bit packing, decoding, query ranges and validation.

The properties run over random valid layouts and always include the boundaries (0, every field's
maximum, the epoch, the last representable millisecond), because off-by-one errors live there.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

import snowflake_db
from snowflake_db import (
    DEFAULT_EPOCH_MS,
    DEFAULT_LAYOUT,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidIdError,
    InvalidLayoutError,
    Layout,
    SnowflakeError,
)
from tests.plugins.core_support import NOW_MS, boundary_ints, layouts

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def tick_start(layout: Layout, timestamp_ms: int) -> int:
    """Start of the tick containing ``timestamp_ms``: what decode reports for it."""
    return layout.epoch_ms + (timestamp_ms - layout.epoch_ms) // layout.tick_ms * layout.tick_ms


# -- defaults ----------------------------------------------------------------------------------


def test_default_layout_values() -> None:
    layout = Layout()
    assert layout == DEFAULT_LAYOUT
    assert (layout.time_bits, layout.worker_bits, layout.sequence_bits) == (41, 10, 12)
    assert (layout.shard_bits, layout.datacenter_bits, layout.tick_ms) == (0, 0, 1)
    assert layout.epoch_ms == DEFAULT_EPOCH_MS == 1_577_836_800_000
    assert layout.epoch == datetime(2020, 1, 1, tzinfo=UTC)
    assert layout.max_worker_id == 1023
    assert layout.max_sequence == 4095
    assert layout.ids_per_tick == 4096
    assert layout.max_ids_per_second == 4_096_000
    assert layout.max_id == 2**63 - 1


def test_default_layout_exhaustion_date() -> None:
    layout = Layout()
    expected = datetime(2089, 9, 6, 15, 47, 35, 552_000, tzinfo=UTC)
    assert layout.exhausted_at == expected
    assert layout.exhausted_at.isoformat().startswith("2089-09-06T15:47:35.552")
    assert layout.max_timestamp_ms + 1 == int(expected.timestamp() * 1000)
    # The last millisecond still encodes; the next one does not.
    assert layout.encode(timestamp_ms=layout.max_timestamp_ms, worker_id=0, sequence=0) > 0
    with pytest.raises(InvalidArgumentError, match="2089-09-06"):
        layout.encode(timestamp_ms=layout.max_timestamp_ms + 1, worker_id=0, sequence=0)


@given(layouts())
def test_as_kwargs_rebuilds_the_layout(layout: Layout) -> None:
    # Every field, datacenter_bits and tick_ms included: copies that list fields by hand drop some.
    assert Layout(**layout.as_kwargs()) == layout


def test_describe_shows_the_limits() -> None:
    description = DEFAULT_LAYOUT.describe()
    assert description["exhausted_at"] == "2089-09-06T15:47:35.552000+00:00"
    assert description["epoch"] == "2020-01-01T00:00:00+00:00"
    assert description["max_worker_id"] == 1023
    assert description["max_ids_per_second_per_worker"] == 4_096_000
    assert description["max_id"] == 2**63 - 1


def test_decoded_id_fields_of_default_layout() -> None:
    moment = datetime(2024, 5, 17, 12, 30, 45, 123_000, tzinfo=UTC)
    timestamp_ms = int(moment.timestamp() * 1000)
    snowflake_id = DEFAULT_LAYOUT.encode(timestamp_ms=timestamp_ms, worker_id=513, sequence=77)
    expected = (timestamp_ms - DEFAULT_EPOCH_MS) << 22 | 513 << 12 | 77
    assert snowflake_id == expected
    decoded = DEFAULT_LAYOUT.decode(snowflake_id)
    assert decoded.id == snowflake_id
    assert decoded.timestamp_ms == timestamp_ms  # Unix ms, not relative to the epoch
    assert decoded.datetime == moment
    assert decoded.datetime.utcoffset() == timedelta(0)
    assert (decoded.worker_id, decoded.sequence, decoded.shard) == (513, 77, 0)
    assert decoded.datacenter_id is None and decoded.machine_id is None


def test_sixty_three_bits_reach_the_signed_bigint_maximum() -> None:
    layout = Layout(time_bits=40, worker_bits=11, sequence_bits=12)
    assert layout.max_id == 2**63 - 1
    top = layout.encode(
        timestamp_ms=layout.max_timestamp_ms,
        worker_id=layout.max_worker_id,
        sequence=layout.max_sequence,
    )
    assert top == 2**63 - 1


# -- round-trip properties ---------------------------------------------------------------------


@given(data=st.data())
def test_encode_decode_round_trip(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    timestamp_ms = data.draw(boundary_ints(layout.epoch_ms, layout.max_timestamp_ms))
    worker_id = data.draw(boundary_ints(0, layout.max_worker_id))
    sequence = data.draw(boundary_ints(0, layout.max_sequence))
    shard = data.draw(boundary_ints(0, layout.max_shard))

    snowflake_id = layout.encode(
        timestamp_ms=timestamp_ms, worker_id=worker_id, sequence=sequence, shard=shard
    )
    assert 0 <= snowflake_id <= layout.max_id < 2**63
    decoded = layout.decode(snowflake_id)
    start = tick_start(layout, timestamp_ms)
    assert decoded.id == snowflake_id
    assert decoded.timestamp_ms == start
    assert decoded.datetime == UNIX_EPOCH + timedelta(milliseconds=start)
    assert decoded.datetime.tzinfo is not None
    assert decoded.worker_id == worker_id
    assert decoded.sequence == sequence
    assert decoded.shard == shard
    assert layout.encode(
        timestamp_ms=decoded.timestamp_ms,
        worker_id=decoded.worker_id,
        sequence=decoded.sequence,
        shard=decoded.shard,
    ) == snowflake_id


@given(data=st.data())
def test_every_id_in_range_decodes_and_re_encodes(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    snowflake_id = data.draw(boundary_ints(0, layout.max_id))
    decoded = layout.decode(snowflake_id)
    assert layout.epoch_ms <= decoded.timestamp_ms <= layout.max_timestamp_ms
    assert layout.encode(
        timestamp_ms=decoded.timestamp_ms,
        worker_id=decoded.worker_id,
        sequence=decoded.sequence,
        shard=decoded.shard,
    ) == snowflake_id


@given(data=st.data())
def test_extreme_parts_give_zero_and_max_id(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    assert layout.encode(timestamp_ms=layout.epoch_ms, worker_id=0, sequence=0, shard=0) == 0
    top = layout.encode(
        timestamp_ms=layout.max_timestamp_ms,
        worker_id=layout.max_worker_id,
        sequence=layout.max_sequence,
        shard=layout.max_shard,
    )
    assert top == layout.max_id == 2**layout.total_bits - 1
    assert layout.decode(top).timestamp_ms == layout.epoch_ms + layout.max_tick * layout.tick_ms
    assert layout.max_timestamp_ms + 1 == int(
        (layout.exhausted_at - UNIX_EPOCH) / timedelta(milliseconds=1)
    )


@given(data=st.data())
def test_encode_orders_by_time_then_worker_then_sequence_then_shard(data: st.DataObject) -> None:
    layout = data.draw(layouts())

    def parts() -> tuple[int, int, int, int]:
        tick = data.draw(boundary_ints(0, layout.max_tick))
        return (
            tick,
            data.draw(boundary_ints(0, layout.max_worker_id)),
            data.draw(boundary_ints(0, layout.max_sequence)),
            data.draw(boundary_ints(0, layout.max_shard)),
        )

    first, second = parts(), parts()

    def encode(p: tuple[int, int, int, int]) -> int:
        return layout.encode(
            timestamp_ms=layout.tick_start_ms(p[0]), worker_id=p[1], sequence=p[2], shard=p[3]
        )

    assert (encode(first) < encode(second)) == (first < second)
    assert (encode(first) == encode(second)) == (first == second)


# -- query ranges ------------------------------------------------------------------------------


@given(data=st.data())
def test_time_range_covers_exactly_the_tick(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    timestamp_ms = data.draw(boundary_ints(layout.epoch_ms, layout.max_timestamp_ms))
    low = layout.min_id_for_time(timestamp_ms)
    high = layout.max_id_for_time(timestamp_ms)
    start = tick_start(layout, timestamp_ms)
    # Every moment of the tick gives the same range (tick-inclusive semantics).
    for moment in (start, start + layout.tick_ms - 1, timestamp_ms):
        if moment <= layout.max_timestamp_ms:
            assert layout.min_id_for_time(moment) == low
            assert layout.max_id_for_time(moment) == high
    assert low == layout.encode(timestamp_ms=start, worker_id=0, sequence=0)
    assert high == layout.encode(
        timestamp_ms=start,
        worker_id=layout.max_worker_id,
        sequence=layout.max_sequence,
        shard=layout.max_shard,
    )
    inside = layout.encode(
        timestamp_ms=timestamp_ms,
        worker_id=data.draw(boundary_ints(0, layout.max_worker_id)),
        sequence=data.draw(boundary_ints(0, layout.max_sequence)),
        shard=data.draw(boundary_ints(0, layout.max_shard)),
    )
    assert low <= inside <= high
    if start > layout.epoch_ms:
        assert layout.max_id_for_time(start - 1) == low - 1
    if start + layout.tick_ms <= layout.max_timestamp_ms:
        assert layout.min_id_for_time(start + layout.tick_ms) == high + 1
    else:
        assert high == layout.max_id


def test_time_range_with_datetimes_and_ten_ms_ticks() -> None:
    layout = Layout(time_bits=40, worker_bits=10, sequence_bits=12, tick_ms=10)
    moment = datetime(2024, 3, 1, 8, 0, 0, 7_500, tzinfo=UTC)  # 7.5 ms into a 10 ms tick
    tick_begin = int(datetime(2024, 3, 1, 8, tzinfo=UTC).timestamp() * 1000)
    low, high = layout.min_id_for_time(moment), layout.max_id_for_time(moment)
    assert low == layout.encode(timestamp_ms=tick_begin, worker_id=0, sequence=0)
    assert high == layout.encode(timestamp_ms=tick_begin + 9, worker_id=1023, sequence=4095)
    assert layout.decode(low).timestamp_ms == layout.decode(high).timestamp_ms == tick_begin
    assert layout.min_id_for_time(tick_begin + 10) == high + 1
    assert layout.max_id_for_time(tick_begin - 1) == low - 1
    # Any time zone: the same instant gives the same range; microseconds are truncated.
    plus_two = moment.astimezone(timezone(timedelta(hours=2)))
    assert layout.min_id_for_time(plus_two) == low
    assert layout.max_id_for_time(plus_two) == high
    assert layout.min_id_for_time(tick_begin + 7) == low


def test_orders_between_two_datetimes_are_a_range_scan() -> None:
    layout = DEFAULT_LAYOUT
    start = datetime(2025, 1, 1, tzinfo=UTC)
    end = datetime(2025, 1, 2, tzinfo=UTC)
    ms = int(start.timestamp() * 1000)
    ids = {
        "before": layout.encode(timestamp_ms=ms - 1, worker_id=1023, sequence=4095),
        "first": layout.encode(timestamp_ms=ms, worker_id=0, sequence=0),
        "middle": layout.encode(timestamp_ms=ms + 3_600_000, worker_id=5, sequence=9),
        "last": layout.encode(timestamp_ms=ms + 86_400_000, worker_id=1023, sequence=4095),
        "after": layout.encode(timestamp_ms=ms + 86_400_001, worker_id=0, sequence=0),
    }
    low, high = layout.min_id_for_time(start), layout.max_id_for_time(end)
    selected = {name for name, value in ids.items() if low <= value <= high}
    assert selected == {"first", "middle", "last"}


# -- datacenter split and shards ---------------------------------------------------------------


def test_datacenter_split_five_plus_five() -> None:
    layout = Layout(datacenter_bits=5)
    worker_id = layout.worker_id_for(datacenter_id=3, machine_id=7)
    assert worker_id == 3 << 5 | 7
    decoded = layout.decode(layout.encode(timestamp_ms=NOW_MS, worker_id=worker_id, sequence=1))
    assert (decoded.datacenter_id, decoded.machine_id, decoded.worker_id) == (3, 7, 103)
    top = layout.worker_id_for(datacenter_id=31, machine_id=31)
    assert top == layout.max_worker_id
    with pytest.raises(InvalidArgumentError, match=r"datacenter_id=32.*31"):
        layout.worker_id_for(datacenter_id=32, machine_id=0)
    with pytest.raises(InvalidArgumentError, match=r"machine_id=32.*31"):
        layout.worker_id_for(datacenter_id=0, machine_id=32)
    with pytest.raises(InvalidArgumentError, match="-1"):
        layout.worker_id_for(datacenter_id=-1, machine_id=0)
    with pytest.raises(InvalidArgumentTypeError):
        layout.worker_id_for(datacenter_id=True, machine_id=0)


@given(data=st.data())
def test_datacenter_split_round_trip(data: st.DataObject) -> None:
    worker_bits = data.draw(st.integers(1, 20))
    datacenter_bits = data.draw(st.integers(1, worker_bits))
    layout = Layout(time_bits=30, worker_bits=worker_bits, datacenter_bits=datacenter_bits)
    machine_bits = worker_bits - datacenter_bits
    datacenter_id = data.draw(boundary_ints(0, 2**datacenter_bits - 1))
    machine_id = data.draw(boundary_ints(0, 2**machine_bits - 1))
    worker_id = layout.worker_id_for(datacenter_id=datacenter_id, machine_id=machine_id)
    assert 0 <= worker_id <= layout.max_worker_id
    decoded = layout.decode(
        layout.encode(timestamp_ms=layout.epoch_ms, worker_id=worker_id, sequence=0)
    )
    assert (decoded.datacenter_id, decoded.machine_id) == (datacenter_id, machine_id)


def test_decode_shard_layout() -> None:
    layout = Layout(time_bits=39, worker_bits=10, sequence_bits=10, shard_bits=4)
    snowflake_id = layout.encode(timestamp_ms=NOW_MS, worker_id=700, sequence=1000, shard=9)
    assert snowflake_id & 0b1111 == 9  # the shard sits in the lowest bits
    decoded = layout.decode(snowflake_id)
    assert (decoded.worker_id, decoded.sequence, decoded.shard) == (700, 1000, 9)
    assert decoded.timestamp_ms == NOW_MS
    assert layout.max_shard == 15
    with pytest.raises(InvalidArgumentError, match=r"shard=16.*15"):
        layout.encode(timestamp_ms=NOW_MS, worker_id=0, sequence=0, shard=16)


# -- invalid layouts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "fragments"),
    [
        ({"time_bits": 42}, ["64", "63"]),
        ({"time_bits": 41, "worker_bits": 10, "sequence_bits": 12, "shard_bits": 1}, ["64", "63"]),
        ({"worker_bits": 64}, ["63"]),
        ({"time_bits": 0}, ["time_bits=0", "1"]),
        ({"time_bits": -1}, ["time_bits=-1", "minimum 1"]),
        ({"worker_bits": -1}, ["worker_bits=-1", "0"]),
        ({"sequence_bits": -3}, ["sequence_bits=-3", "0"]),
        ({"shard_bits": -1}, ["shard_bits=-1", "0"]),
        ({"datacenter_bits": 11}, ["datacenter_bits=11", "10"]),
        ({"tick_ms": 0}, ["tick_ms=0", "1"]),
        ({"epoch_ms": -1}, ["epoch_ms=-1", "0"]),
    ],
)
def test_invalid_layout_fields(fields: dict[str, int], fragments: list[str]) -> None:
    with pytest.raises(InvalidLayoutError) as caught:
        Layout(**fields)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, SnowflakeError)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_future_epoch_is_rejected_with_value_and_limit() -> None:
    future = time.time_ns() // 1_000_000 + 86_400_000
    with pytest.raises(InvalidLayoutError) as caught:
        Layout(epoch_ms=future)
    message = str(caught.value)
    assert f"epoch_ms={future}" in message
    assert "future" in message
    limit = int(re.search(r"maximum (\d+)", message).group(1))  # type: ignore[union-attr]
    assert future - 86_400_000 - 60_000 <= limit < future


@pytest.mark.parametrize("field", ["time_bits", "worker_bits", "sequence_bits", "shard_bits",
                                   "datacenter_bits", "epoch_ms", "tick_ms"])
@pytest.mark.parametrize("value", [True, 10.0, "10", None])
def test_layout_fields_must_be_ints(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentTypeError) as caught:
        Layout(**{field: value})  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert field in str(caught.value)
    assert type(value).__name__ in str(caught.value)


def test_layout_is_immutable() -> None:
    with pytest.raises(AttributeError):
        DEFAULT_LAYOUT.worker_bits = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        {"time_bits": 48, "worker_bits": 3, "sequence_bits": 12},
        {"time_bits": 63, "worker_bits": 0, "sequence_bits": 0},
        {"time_bits": 45, "worker_bits": 6, "sequence_bits": 12, "tick_ms": 10},
    ],
)
def test_wide_time_field_is_usable_or_rejected(fields: dict[str, int]) -> None:
    """A layout whose time bits outlast year 9999 must either be refused up front with
    InvalidLayoutError or encode and decode at its boundaries: never a bare ValueError."""
    try:
        layout = Layout(**fields)
    except InvalidLayoutError:
        return
    assert layout.decode(0).timestamp_ms == layout.epoch_ms
    assert layout.encode(timestamp_ms=layout.epoch_ms, worker_id=0, sequence=0) == 0
    assert layout.decode(layout.max_id).timestamp_ms == (
        layout.epoch_ms + layout.max_tick * layout.tick_ms
    )
    assert layout.min_id_for_time(layout.epoch_ms) == 0


# -- invalid encode / decode arguments ---------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "fragments"),
    [
        ({"worker_id": 1024}, ["worker_id=1024", "1023"]),
        ({"worker_id": -1}, ["worker_id=-1", "0"]),
        ({"sequence": 4096}, ["sequence=4096", "4095"]),
        ({"sequence": -1}, ["sequence=-1", "0"]),
        ({"shard": 1}, ["shard=1", "maximum 0"]),
        ({"shard": -1}, ["shard=-1", "0"]),
        ({"timestamp_ms": DEFAULT_EPOCH_MS - 1}, [str(DEFAULT_EPOCH_MS - 1), "2020-01-01"]),
        ({"timestamp_ms": DEFAULT_LAYOUT.max_timestamp_ms + 1},
         [str(DEFAULT_LAYOUT.max_timestamp_ms + 1), str(DEFAULT_LAYOUT.max_timestamp_ms)]),
    ],
)
def test_encode_out_of_range(parts: dict[str, int], fragments: list[str]) -> None:
    arguments = {"timestamp_ms": NOW_MS, "worker_id": 1, "sequence": 0, **parts}
    with pytest.raises(InvalidArgumentError) as caught:
        DEFAULT_LAYOUT.encode(**arguments)
    assert isinstance(caught.value, ValueError)
    for fragment in fragments:
        assert fragment in str(caught.value)


@pytest.mark.parametrize("name", ["timestamp_ms", "worker_id", "sequence", "shard"])
@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_encode_parts_must_be_ints(name: str, value: object) -> None:
    arguments: dict[str, object] = {"timestamp_ms": NOW_MS, "worker_id": 1, "sequence": 0}
    arguments[name] = value
    with pytest.raises(InvalidArgumentTypeError, match=name):
        DEFAULT_LAYOUT.encode(**arguments)  # type: ignore[arg-type]


def test_decode_negative_id() -> None:
    with pytest.raises(InvalidIdError) as caught:
        DEFAULT_LAYOUT.decode(-1)
    assert isinstance(caught.value, ValueError)
    assert "-1" in str(caught.value)
    assert "minimum 0" in str(caught.value)


@given(layout=layouts())
def test_decode_id_above_max_id(layout: Layout) -> None:
    with pytest.raises(InvalidIdError) as caught:
        layout.decode(layout.max_id + 1)
    assert str(layout.max_id + 1) in str(caught.value)
    assert str(layout.max_id) in str(caught.value)


def test_decode_id_above_signed_bigint() -> None:
    with pytest.raises(InvalidIdError, match=str(2**63)):
        DEFAULT_LAYOUT.decode(2**63)
    with pytest.raises(InvalidIdError, match=str(2**64 - 1)):
        DEFAULT_LAYOUT.decode(2**64 - 1)


@pytest.mark.parametrize("value", [True, 1.0, 12345.6, "12345", None, b"1"])
def test_decode_non_int(value: object) -> None:
    with pytest.raises(InvalidArgumentTypeError) as caught:
        DEFAULT_LAYOUT.decode(value)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert type(value).__name__ in str(caught.value)


def test_naive_datetime_is_rejected() -> None:
    naive = datetime(2024, 1, 1, 12, 0)
    for method in (DEFAULT_LAYOUT.min_id_for_time, DEFAULT_LAYOUT.max_id_for_time):
        with pytest.raises(InvalidArgumentError, match="naive") as caught:
            method(naive)
        assert "2024" in str(caught.value)


def test_iso_strings_without_a_zone_mean_utc() -> None:
    utc_midnight = datetime(2024, 1, 1, tzinfo=UTC)
    for text in ("2024-01-01", "2024-01-01T00:00:00", "2024-01-01T00:00:00Z",
                 "2024-01-01T01:00:00+01:00"):
        assert DEFAULT_LAYOUT.min_id_for_time(text) == DEFAULT_LAYOUT.min_id_for_time(utc_midnight)
        assert DEFAULT_LAYOUT.max_id_for_time(text) == DEFAULT_LAYOUT.max_id_for_time(utc_midnight)
    with pytest.raises(InvalidArgumentError, match="'new year' is not an ISO 8601 date"):
        DEFAULT_LAYOUT.min_id_for_time("new year")


def test_layout_limits_are_named_for_what_is_wrong() -> None:
    with pytest.raises(InvalidLayoutError, match="time_bits=-3 is below the minimum 1"):
        Layout(time_bits=-3)
    with pytest.raises(InvalidLayoutError, match="cannot lie before 1970"):
        Layout(epoch_ms=-5)
    with pytest.raises(InvalidLayoutError, match="must not lie in the future"):
        Layout(epoch_ms=time.time_ns() // 1_000_000 + 60_000)


def test_time_range_outside_the_layout() -> None:
    before = datetime(2019, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    with pytest.raises(InvalidArgumentError, match="2020-01-01"):
        DEFAULT_LAYOUT.min_id_for_time(before)
    after = datetime(2089, 9, 6, 15, 47, 35, 552_000, tzinfo=UTC)
    with pytest.raises(InvalidArgumentError, match="2089-09-06"):
        DEFAULT_LAYOUT.max_id_for_time(after)
    for value in (True, 1.5e12, b"2024-01-01"):
        with pytest.raises(InvalidArgumentTypeError):
            DEFAULT_LAYOUT.min_id_for_time(value)  # type: ignore[arg-type]


def test_every_argument_error_is_a_value_error() -> None:
    for error in (InvalidLayoutError, InvalidIdError, InvalidArgumentError,
                  InvalidArgumentTypeError):
        assert issubclass(error, ValueError)
        assert issubclass(error, snowflake_db.SnowflakeError)
