"""A test's scratch database is dropped even while a session it left behind holds a lock on one
of its tables: on MariaDB such a drop waited a day (the server's lock_wait_timeout) and held the
whole run until CI's time limit."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest
from sqlalchemy import create_engine, inspect

from .databases import DROP_LOCK_WAIT_S, create_database, drop_database, server_url


def test_mariadb_drop_ends_the_sessions_a_test_left_in_a_transaction(tmp_path: Path) -> None:
    database = create_database("mariadb", tmp_path)
    url = database.url
    left_behind = pymysql.connect(host=url.host, port=url.port or 3306, user=url.username,
                                  password=url.password or "", database=database.name,
                                  autocommit=False, read_timeout=DROP_LOCK_WAIT_S * 2)
    try:
        with left_behind.cursor() as cursor:
            cursor.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
            cursor.execute("SELECT COUNT(*) FROM orders")  # its transaction locks the table
        drop_database(database)  # a lock it could not end would fail it in DROP_LOCK_WAIT_S

        admin = create_engine(server_url("mariadb"))
        try:
            assert database.name not in inspect(admin).get_schema_names()
        finally:
            admin.dispose()
        with pytest.raises(pymysql.MySQLError), left_behind.cursor() as cursor:
            cursor.execute("SELECT 1")  # its session was ended
    finally:
        left_behind.close()
