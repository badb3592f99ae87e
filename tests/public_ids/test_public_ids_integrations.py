"""Public numbers outside Django: the SQLAlchemy hybrid attribute on PostgreSQL, MariaDB and
SQLite, the Pydantic type through FastAPI, and ``snowflake-db public`` with its exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import BigInteger, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import snowflake_db
from snowflake_db.errors import InvalidArgumentError, PublicIdError
from snowflake_db.public_ids import (
    PublicIdCodec,
    codec_for,
    configure_public_ids,
    generate_key,
    parse_keys,
)
from snowflake_db.pydantic import public_id_type
from snowflake_db.sqlalchemy import snowflake_mapped_column
from snowflake_db.sqlalchemy.public_ids import public_id_property
from tests.plugins.databases import ScratchDatabase
from tests.plugins.public_ids_support import foreign_number, mistyped

KEY = generate_key()
SCRIPT = shutil.which("snowflake-db", path=str(Path(sys.executable).parent))


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "public_orders"
    id: Mapped[int] = snowflake_mapped_column()
    note: Mapped[str] = mapped_column(String(20), default="")

    public_id = public_id_property("orders")


class Invoice(Base):
    __tablename__ = "public_invoices"
    id: Mapped[int] = snowflake_mapped_column()
    number: Mapped[int] = mapped_column(BigInteger)

    public_number = public_id_property("invoices", attribute="number", group=4)


@pytest.fixture(autouse=True)
def keys() -> Iterator[None]:
    configure_public_ids(KEY)
    snowflake_db.configure(worker_id=5)
    yield
    snowflake_db.reset()
    configure_public_ids(None)


def test_sqlalchemy_where_public_id_is_a_key_comparison(any_db: ScratchDatabase) -> None:
    engine = create_engine(any_db.url)
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            orders = [Order(note=f"o{i}") for i in range(3)]
            unsaved = Order()
            assert unsaved.public_id is None
            session.add_all(orders)
            session.add(Invoice(number=2**62 + 9))
            session.commit()
            first, second, third = orders
            assert first.public_id == codec_for("orders").encode(first.id)

            statement = select(Order).where(Order.public_id == first.public_id)
            compiled = statement.compile(engine, compile_kwargs={"literal_binds": True})
            assert f"public_orders.id = {first.id}" in str(compiled)
            assert session.scalars(statement).one() is first
            grouped = codec_for("orders").encode(second.id, group=4).lower()
            assert session.scalars(select(Order).where(Order.public_id == grouped)).one() \
                is second
            chosen = select(Order.id).where(
                Order.public_id.in_([first.public_id, third.public_id, "nonsense"])
            )
            assert set(session.scalars(chosen)) == {first.id, third.id}
            others = select(Order.id).where(Order.public_id != first.public_id)
            assert set(session.scalars(others)) == {second.id, third.id}

            other_namespace = foreign_number(codec_for("invoices"), codec_for("orders"), first.id)
            for wrong in (mistyped(first.public_id), other_namespace, "", "x" * 16):
                assert session.scalars(select(Order).where(Order.public_id == wrong)).all() == []
                everything = select(Order.id).where(Order.public_id != wrong)
                assert len(session.scalars(everything).all()) == 3
            assert session.scalars(
                select(Order).where(Order.public_id.in_(["bad", other_namespace]))
            ).all() == []

            invoice = session.scalars(select(Invoice)).one()
            assert invoice.public_number.count("-") == 3
            found = select(Invoice).where(Invoice.public_number == invoice.public_number)
            assert session.scalars(found).one() is invoice
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def test_sqlalchemy_refuses_what_public_numbers_cannot_do() -> None:
    with pytest.raises(InvalidArgumentError, match="not ordered"):
        _ = Order.public_id < "0"
    with pytest.raises(TypeError):
        _ = Order.public_id == 12345  # the key is not a public number
    with pytest.raises(InvalidArgumentError, match="namespace"):
        public_id_property("")
    with pytest.raises(InvalidArgumentError, match="group"):
        public_id_property("orders", group=0)


OrderNumber = public_id_type("orders")
StrictOrderNumber = public_id_type("orders", accept_keys=False)


class OrderOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: OrderNumber
    note: str


class OrderIn(BaseModel):
    order: StrictOrderNumber


def test_pydantic_type_is_the_key_in_python_and_the_number_in_json() -> None:
    key = 7262318491041271808
    number = codec_for("orders").encode(key)
    out = OrderOut(id=key, note="n")
    assert out.id == key and out.model_dump() == {"id": key, "note": "n"}
    assert json.loads(out.model_dump_json()) == {"id": number, "note": "n"}
    assert OrderOut.model_validate_json(out.model_dump_json()) == out
    assert OrderOut(id=number.lower(), note="n").id == key
    assert OrderOut.model_json_schema()["properties"]["id"]["type"] == "string"
    with pytest.raises(ValidationError, match="check symbol"):
        OrderOut(id=mistyped(number), note="n")
    with pytest.raises(ValidationError, match="is a string"):
        OrderOut.model_validate_json(json.dumps({"id": key, "note": "n"}))  # JSON: no keys
    with pytest.raises(ValidationError):
        OrderIn(order=key)  # accept_keys=False: not even from Python
    for bad in (True, -1, 2**63, 1.5, None):
        with pytest.raises(ValidationError):
            OrderOut(id=bad, note="n")
    assert OrderIn(order=number).order == key


def test_fastapi_round_trip(sqlite_db: ScratchDatabase) -> None:
    engine = create_engine(sqlite_db.url)
    Base.metadata.create_all(engine)
    app = FastAPI()

    @app.post("/orders")
    def create(note: str) -> OrderOut:
        with Session(engine) as session:
            order = Order(note=note)
            session.add(order)
            session.commit()
            return OrderOut.model_validate(order)

    @app.get("/orders/{number}")
    def read(number: OrderNumber) -> OrderOut:
        with Session(engine) as session:
            order = session.get(Order, number)
            if order is None:
                raise HTTPException(404)
            return OrderOut.model_validate(order)

    @app.post("/refunds")
    def refund(body: OrderIn) -> dict[str, str]:
        return {"key": str(body.order)}

    try:
        client = TestClient(app)
        created = client.post("/orders", params={"note": "tea"})
        assert created.status_code == 200, created.text
        number = created.json()["id"]
        with Session(engine) as session:
            key = session.scalars(select(Order.id)).one()
        assert number == codec_for("orders").encode(key) and str(key) not in created.text
        assert client.get(f"/orders/{number}").json() == {"id": number, "note": "tea"}
        assert client.get(f"/orders/{number.lower()}").status_code == 200
        refused = client.get(f"/orders/{mistyped(number)}")
        assert refused.status_code == 422 and "check symbol" in refused.text
        assert client.get(f"/orders/{key}").status_code == 422  # a key is no number
        assert client.post("/refunds", json={"order": number}).json() == {"key": str(key)}
        assert client.post("/refunds", json={"order": key}).status_code == 422
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def run(*args: str, env_keys: str | None = KEY, stdin: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the snowflake-db console script is not installed in this environment"
    env = {k: v for k, v in os.environ.items() if k != "SNOWFLAKE_DB_PUBLIC_ID_KEYS"}
    if env_keys is not None:
        env["SNOWFLAKE_DB_PUBLIC_ID_KEYS"] = env_keys
    return subprocess.run([SCRIPT, "public", *args], check=False, capture_output=True,
                          text=True, timeout=60, env=env, input=stdin)


def test_cli_encode_decode_and_exit_codes() -> None:
    keys = [7262318491041271808, 12345]
    numbers = [codec_for("orders").encode(k) for k in keys]
    invoices_refuse = foreign_number(codec_for("orders"), codec_for("invoices"), keys[0])
    encoded = run("encode", "--namespace", "orders", *map(str, keys))
    assert encoded.returncode == 0, encoded.stderr
    assert encoded.stdout.split() == numbers
    grouped = run("encode", "--namespace", "orders", "--group", "4", str(keys[0]))
    assert grouped.stdout.strip() == codec_for("orders").encode(keys[0], group=4)
    decoded = run("decode", "--namespace", "orders", numbers[0], numbers[1].lower())
    assert decoded.returncode == 0 and decoded.stdout.split() == list(map(str, keys))
    piped = run("decode", "--namespace", "orders", "-", stdin=f"{numbers[0]}\n\n")
    assert piped.returncode == 0 and piped.stdout.split() == [str(keys[0])]

    # A refused number: one line naming it and why, nothing on stdout, status 2.
    for args, reason in (
        (["decode", "--namespace", "orders", numbers[0], mistyped(numbers[1])], "check symbol"),
        (["decode", "--namespace", "invoices", invoices_refuse], "namespace 'invoices'"),
        (["decode", "--namespace", "orders", "ABC"], "ABC"),
        (["encode", "--namespace", "orders", "-5"], "'-5'"),
        (["encode", "--namespace", "orders", str(2**63)], str(2**63)),
    ):
        refused = run(*args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert refused.stdout == "" and reason in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    unknown_version = run("decode", "--namespace", "orders", numbers[0],
                          env_keys=generate_key(version=2))
    assert unknown_version.returncode == 2 and "key version 1" in unknown_version.stderr
    missing = run("decode", "--namespace", "orders", numbers[0], env_keys=None)
    assert missing.returncode == 2 and "SNOWFLAKE_DB_PUBLIC_ID_KEYS" in missing.stderr
    assert run("decode", numbers[0]).returncode == 2  # --namespace is required


def test_cli_new_key_makes_a_working_key() -> None:
    made = run("new-key", "--version", "4", env_keys=None)
    assert made.returncode == 0, made.stderr
    text = made.stdout.strip()
    assert list(parse_keys(text)) == [4] and len(parse_keys(text)[4]) == 32
    assert run("new-key", env_keys=None).stdout.strip() != run("new-key").stdout.strip()
    number = run("encode", "--namespace", "orders", "99", env_keys=text).stdout.strip()
    assert PublicIdCodec(parse_keys(text), namespace="orders").decode(number) == 99
    assert run("new-key", "--version", "32").returncode == 2
    with pytest.raises(PublicIdError):
        PublicIdCodec(parse_keys(text), namespace="orders").decode(mistyped(number))


def test_cli_messages_name_the_action_and_the_command_that_makes_a_key() -> None:
    """Every error of an action starts with the same prefix (usage mistakes and refused
    input alike), and the messages about keys name `public new-key`, as help and docs do."""
    number = codec_for("orders").encode(12345)
    short_key = "1:" + "A" * 14  # 10 bytes of base64: no AES key length
    cases = {
        "decode": [
            (run("decode", number), "the following arguments are required: --namespace"),
            (run("decode", "--namespace", "orders", "ABC"), "'ABC'"),
            (run("decode", "--namespace", "orders", number, env_keys=None),
             "snowflake-db public new-key"),
        ],
        "encode": [
            (run("encode", "12345"), "the following arguments are required: --namespace"),
            (run("encode", "--namespace", "orders", "-5"), "'-5'"),
            (run("encode", "--namespace", "orders", "12345", env_keys=short_key),
             "key version 1 has 10 bytes; an AES key has 16, 24 or 32 bytes (make one with "
             "`snowflake-db public new-key`"),
            (run("encode", "--namespace", "orders", "12345", env_keys=" "),
             "the output of `snowflake-db public new-key`"),
        ],
    }
    for action, results in cases.items():
        for result, reason in results:
            assert result.returncode == 2 and result.stdout == "", result
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                f"snowflake-db public {action}: error: "), result.stderr
            assert reason in lines[0], result.stderr
            assert "generate-key" not in lines[0], result.stderr
    missing_keys = run("encode", "--namespace", "orders", "1", env_keys=short_key).stderr
    assert "SNOWFLAKE_DB_PUBLIC_ID_KEYS" in missing_keys  # the source of the bad key
    help_text = subprocess.run([str(SCRIPT), "public", "decode", "--help"], check=True,
                               capture_output=True, text=True, timeout=60).stdout
    assert "the namespace the numbers were made for" in help_text
