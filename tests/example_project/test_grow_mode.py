"""``python -m example_project --grow`` end to end: four throwaway PostgreSQL clusters, order
processes writing throughout, half of the logical shards moved by ``ShardMover``, then the
mode's own checks (every order once, on the server the final map names, none left behind).
Skipped without the PostgreSQL binaries (failed under ``CI=true``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from example_project import local_servers
from tests.plugins.databases import unavailable

REPO = Path(__file__).resolve().parents[2]


def test_the_shop_grows_onto_new_servers_while_orders_keep_coming() -> None:
    problem = local_servers.postgres_unavailable()
    if problem:
        unavailable(problem)
    result = subprocess.run(
        [sys.executable, "-m", "example_project", "--grow", "--processes", "2",
         "--customers", "32", "--settle", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "moving 8 logical shards to pg_c and pg_d" in output
    assert output.count("  moved shard ") == 8, output
    for check in ("every acknowledged order found", "no order on two servers (0 doubled)",
                  "every order on the server the final map names (0 elsewhere)",
                  "none of the moved shards' rows left on their old servers",
                  "all checks passed"):
        assert check in output, output
    assert "[FAIL]" not in output, output
