"""Demo: generate Snowflake IDs from two worker IDs, decode them, and check they are unique."""

from __future__ import annotations

import sys

from snowflake_db import Layout, SnowflakeGenerator


def main() -> int:
    layout = Layout()
    generators = [SnowflakeGenerator(worker_id, layout=layout) for worker_id in (1, 2)]
    ids = [snowflake_id for generator in generators for snowflake_id in generator.next_ids(50_000)]
    print(f"generated {len(ids):,} IDs from worker IDs 1 and 2")
    for snowflake_id in (ids[0], ids[-1]):
        part = layout.decode(snowflake_id)
        print(
            f"  {snowflake_id}  created {part.datetime.isoformat()}  "
            f"worker {part.worker_id}  sequence {part.sequence}"
        )
    duplicates = len(ids) - len(set(ids))
    print(f"duplicates: {duplicates}")
    print(f"this layout runs out at {layout.exhausted_at.isoformat()}")
    return 1 if duplicates else 0


if __name__ == "__main__":
    sys.exit(main())
