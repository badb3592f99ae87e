"""PostgreSQL views and materialized views that depend on columns about to change type.

PostgreSQL refuses ``ALTER COLUMN ... TYPE`` on a column a view or rule uses ("cannot alter type
of a column used by a view or rule"): django-oscar reads a materialized view over its product
and category keys. :func:`views_depending_on` finds those views and every view built on them,
with what recreating them needs (definition, options, a materialized view's indexes and whether
it was populated); :func:`drop_views` and :func:`recreate_views` wrap the change. Grants,
comments and ownership of the views are not kept: the docs say to grant again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DependentView", "drop_views", "recreate_views", "views_depending_on"]

_DIRECT = """
SELECT DISTINCT view.oid
FROM pg_depend dep
JOIN pg_rewrite rule ON rule.oid = dep.objid
JOIN pg_class view ON view.oid = rule.ev_class
JOIN pg_attribute att ON att.attrelid = dep.refobjid AND att.attnum = dep.refobjsubid
WHERE dep.classid = 'pg_rewrite'::regclass AND dep.refclassid = 'pg_class'::regclass
  AND dep.refobjid = to_regclass(%s) AND att.attname = %s AND view.oid <> dep.refobjid
"""

_ON_VIEW = """
SELECT DISTINCT view.oid
FROM pg_depend dep
JOIN pg_rewrite rule ON rule.oid = dep.objid
JOIN pg_class view ON view.oid = rule.ev_class
WHERE dep.classid = 'pg_rewrite'::regclass AND dep.refclassid = 'pg_class'::regclass
  AND dep.refobjid = %s AND view.oid <> dep.refobjid
"""

_DESCRIBE = """
SELECT format('%%I.%%I', ns.nspname, view.relname), view.relkind, pg_get_viewdef(view.oid),
       coalesce(array_to_string(view.reloptions, ', '), ''), view.relispopulated,
       coalesce((SELECT array_agg(pg_get_indexdef(ind.indexrelid) ORDER BY ind.indexrelid)
                 FROM pg_index ind WHERE ind.indrelid = view.oid), '{}')
FROM pg_class view JOIN pg_namespace ns ON ns.oid = view.relnamespace
WHERE view.oid = %s
"""


@dataclass(frozen=True)
class DependentView:
    """A view (``kind`` "v") or materialized view ("m") and what recreating it needs."""

    name: str  # schema-qualified, quoted
    kind: str
    definition: str
    options: str
    populated: bool
    indexes: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{'materialized view' if self.kind == 'm' else 'view'} {self.name}"


def views_depending_on(cursor: Any, columns: Iterable[tuple[str, str]]) -> list[DependentView]:
    """Every view using one of ``(table, column)``, and every view on those, in an order that
    creates each after the views it reads (drop them in the reverse order)."""
    found: list[int] = []
    pending: list[int] = []
    for table, column in columns:
        cursor.execute(_DIRECT, [table, column])
        pending.extend(row[0] for row in cursor.fetchall())
    while pending:
        oid = pending.pop(0)
        if oid in found:
            found.remove(oid)  # seen again from a view it depends on: it must come later
        found.append(oid)
        cursor.execute(_ON_VIEW, [oid])
        pending.extend(row[0] for row in cursor.fetchall())
    views = []
    for oid in found:
        cursor.execute(_DESCRIBE, [oid])
        name, kind, definition, options, populated, indexes = cursor.fetchone()
        views.append(DependentView(name, kind, definition, options, bool(populated),
                                   tuple(indexes)))
    return views


def drop_views(cursor: Any, views: list[DependentView]) -> None:
    for view in reversed(views):
        keyword = "MATERIALIZED VIEW" if view.kind == "m" else "VIEW"
        cursor.execute(f"DROP {keyword} {view.name}")


def recreate_views(cursor: Any, views: list[DependentView]) -> None:
    """Create the views again from their definitions (in the new column types); a materialized
    view is filled again (``WITH DATA``) if it was populated, and gets its indexes back."""
    for view in views:
        options = f" WITH ({view.options})" if view.options else ""
        body = view.definition.strip().rstrip(";")
        if view.kind == "m":
            data = "WITH DATA" if view.populated else "WITH NO DATA"
            cursor.execute(f"CREATE MATERIALIZED VIEW {view.name}{options} AS {body} {data}")
            for index in view.indexes:
                cursor.execute(index)
        else:
            cursor.execute(f"CREATE VIEW {view.name}{options} AS {body}")
