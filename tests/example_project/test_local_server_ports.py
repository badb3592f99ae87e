"""The throwaway servers' ports: chosen where no outgoing connection can take them, and a first
start whose port was taken anyway (another throwaway server chose it) moves to another one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from example_project import local_servers

from ..plugins.databases import throwaway_server


def test_free_ports_are_below_the_range_of_outgoing_connections() -> None:
    start = local_servers._ephemeral_ports_start()
    ports = [local_servers.free_port() for _ in range(50)]
    assert all(local_servers._LOWEST_PORT <= port < start for port in ports)
    assert len(set(ports)) > 40  # chosen at random, not one after the other


@contextmanager
def _taken(port: int) -> Iterator[None]:
    """Something else listens on ``port`` for the block."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        yield


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_a_first_start_whose_port_was_taken_moves_to_another(kind: str) -> None:
    server = throwaway_server(kind)
    try:
        chosen = server.port
        with _taken(chosen):
            server.start()
            assert server.port != chosen
            with server.connect() if kind == "mariadb" else _pg(server) as connection:
                assert connection is not None
        # Once it ran, its port is in URLs: a restart on a taken port fails, it never moves.
        server.stop()
        with _taken(server.port), pytest.raises(RuntimeError, match="did not start"):
            server.start()
    finally:
        server.close()


@contextmanager
def _pg(server: Any) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(host=server.host, port=server.port, user=server.user,
                         dbname="postgres") as connection:
        yield connection
