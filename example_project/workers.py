"""Worker IDs for the demo processes: leased from the worker table on the control database."""

from __future__ import annotations

from typing import Any

import snowflake_db
from snowflake_db import SnowflakeGenerator

from .common import SHOP_LAYOUT


def configure_worker(control_url: str, **allocator_options: Any) -> SnowflakeGenerator:
    """Make the process-wide generator lease its worker ID from ``control_url``'s worker table."""
    from snowflake_db.worker import TableWorkerAllocator

    allocator = TableWorkerAllocator(control_url, **allocator_options)
    generator = snowflake_db.configure(allocator=allocator, layout=SHOP_LAYOUT)
    generator.ensure_worker()  # fail fast if the control database is unusable
    return generator
