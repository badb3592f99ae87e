"""The Pydantic ID type: an int in Python, a string in JSON, parsed back from either."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from snowflake_db import Layout
from snowflake_db.pydantic import SnowflakeIdStr, parse_snowflake_id, snowflake_id_type

SMALL = Layout(time_bits=31, worker_bits=10, sequence_bits=12)
SmallId = snowflake_id_type(SMALL)


class OrderOut(BaseModel):
    id: SnowflakeIdStr
    parent_id: SnowflakeIdStr | None = None
    related: list[SnowflakeIdStr] = []


class SmallOut(BaseModel):
    id: SmallId


def test_json_uses_strings_python_keeps_ints() -> None:
    big = 2**63 - 1
    order = OrderOut(id=big, parent_id="7262318491041271808", related=[2**53 + 1, "3"])
    assert order.model_dump() == {
        "id": big,
        "parent_id": 7262318491041271808,
        "related": [2**53 + 1, 3],
    }
    payload = json.loads(order.model_dump_json())
    assert payload == {
        "id": str(big),
        "parent_id": "7262318491041271808",
        "related": [str(2**53 + 1), "3"],
    }
    assert OrderOut.model_validate_json(order.model_dump_json()) == order
    schema = OrderOut.model_json_schema()["properties"]["id"]
    assert schema["type"] == "string"


@pytest.mark.parametrize(
    "bad", ["-1", str(2**63), "12a", "", " ", 1.0, True, -5, 2**63, "١٢٣", None]
)
def test_rejects_what_cannot_be_an_id(bad: object) -> None:
    with pytest.raises(ValidationError):
        OrderOut(id=bad)


def test_range_follows_the_layout() -> None:
    assert SmallOut(id=str(SMALL.max_id)).id == SMALL.max_id
    with pytest.raises(ValidationError, match="exceeds the maximum"):
        SmallOut(id=SMALL.max_id + 1)
    assert parse_snowflake_id(" 42 ") == 42
