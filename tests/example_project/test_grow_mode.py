"""``python -m example_project --grow [--backend mariadb]`` end to end: four throwaway servers
(PostgreSQL clusters, or mariadbd servers), order processes writing throughout, half of the
logical shards moved by ``ShardMover``, then the mode's own checks (every order once, on the
server the final map names, none left behind). Skipped without the backend's binaries (failed
under ``CI=true``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from example_project import local_servers
from tests.plugins.databases import unavailable

REPO = Path(__file__).resolve().parents[2]
#: Per backend: why its throwaway servers cannot run here (or None), and the new servers.
BACKENDS = {
    "postgresql": (local_servers.postgres_unavailable, "pg_c and pg_d"),
    "mariadb": (local_servers.mariadb_unavailable, "maria_c and maria_d"),
}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_shop_grows_onto_new_servers_while_orders_keep_coming(backend: str) -> None:
    unavailable_reason, new_servers = BACKENDS[backend]
    problem = unavailable_reason()
    if problem:
        unavailable(problem)
    result = subprocess.run(
        [sys.executable, "-m", "example_project", "--grow", "--backend", backend,
         "--processes", "2", "--customers", "32", "--settle", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"moving 8 logical shards to {new_servers}" in output
    assert output.count("  moved shard ") == 8, output
    for check in ("every acknowledged order found", "no order on two servers (0 doubled)",
                  "every order on the server the final map names (0 elsewhere)",
                  "every order has its last acknowledged total",
                  "none of the moved shards' rows left on their old servers",
                  "every move and order process finished"):
        assert f"[ok] {check}" in output, output
    assert "all checks passed" in output and "[FAIL]" not in output, output


def test_the_grow_mode_refuses_an_unknown_backend() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "example_project", "--grow", "--backend", "sqlite"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--backend: invalid choice: 'sqlite'" in result.stderr
    assert "'postgresql', 'mariadb'" in result.stderr
