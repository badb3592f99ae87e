"""What a bulk load writes: a table's name, its columns in order, and which one is the key.

The loaders take rows as lists in column order; :func:`fill_keys` gives every row without a
key its Snowflake ID with one ``next_ids`` call, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from ..errors import InvalidArgumentError

__all__ = [
    "BulkTable", "ChunkedRows", "ColumnRows", "fill_key_column", "fill_keys", "rows_as_lists"
]


@dataclass(frozen=True)
class BulkTable:
    """``name`` (optionally ``schema``), the ``columns`` each row gives in this order, and
    ``key``: the column filled with Snowflake IDs where a row has ``None`` (or no key)."""

    name: str
    columns: tuple[str, ...]
    key: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidArgumentError("a bulk load needs a table name")
        if not self.columns:
            raise InvalidArgumentError(f"a bulk load into {self.name!r} needs at least one column")
        if len(set(self.columns)) != len(self.columns):
            raise InvalidArgumentError(f"columns of {self.name!r} repeat: {self.columns!r}")
        if self.key is not None and self.key not in self.columns:
            raise InvalidArgumentError(
                f"key column {self.key!r} is not among the columns {self.columns!r}"
            )

    @property
    def key_index(self) -> int | None:
        return None if self.key is None else self.columns.index(self.key)

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


def rows_as_lists(
    table: BulkTable,
    rows: Iterable[Mapping[str, Any] | Sequence[Any]],
    optional: Iterable[str] = (),
) -> list[list[Any]]:
    """Rows as lists in ``table.columns`` order: mappings by name (a missing key column, or
    one named in ``optional``, is ``None``; any other missing or unknown column is an error),
    sequences as given."""
    columns = table.columns
    known = frozenset(columns)
    may_miss = {table.key, *optional}
    out: list[list[Any]] = []
    for number, row in enumerate(rows):
        if isinstance(row, Mapping):
            if row.keys() - known:
                raise InvalidArgumentError(
                    f"row {number} of {table.label} has columns {sorted(row.keys() - known)} "
                    f"that are not among {list(columns)}"
                )
            try:
                out.append([row[c] if c in row or c not in may_miss else None for c in columns])
            except KeyError as missing:
                raise InvalidArgumentError(
                    f"row {number} of {table.label} lacks {missing.args[0]!r}"
                ) from None
        else:
            values = list(row)
            if len(values) != len(columns):
                raise InvalidArgumentError(
                    f"row {number} of {table.label} has {len(values)} values for "
                    f"{len(columns)} columns {list(columns)}"
                )
            out.append(values)
    return out


def fill_keys(rows: list[list[Any]], index: int, issue: Callable[[int], list[int]]) -> int:
    """Put a new ID into column ``index`` of every row where it is ``None``, all from one
    ``issue(n)`` call (``generator.next_ids``); returns how many were made."""
    waiting = [row for row in rows if row[index] is None]
    if waiting:
        for row, key in zip(waiting, issue(len(waiting)), strict=True):
            row[index] = key
    return len(waiting)


def fill_key_column(column: list[Any], issue: Callable[[int], list[int]]) -> int:
    """:func:`fill_keys` for a key column kept as a list (:class:`ColumnRows`)."""
    missing = column.count(None)
    if missing == len(column):
        column[:] = issue(missing)
    elif missing:
        spots = [index for index, value in enumerate(column) if value is None]
        for index, key in zip(spots, issue(missing), strict=True):
            column[index] = key
    return missing


class ColumnRows(Sequence[tuple[Any, ...]]):
    """Rows kept as columns (one list per column), read as tuples made on the fly.

    A load of a million rows then allocates a handful of lists instead of a million row lists
    that outlive the call; CPython's cyclic garbage collector, triggered by such allocations,
    otherwise scans every live object (the caller's model instances too) again and again,
    which measured here as more than half of a Django load's time.
    """

    __slots__ = ("columns",)

    def __init__(self, columns: Sequence[list[Any]]) -> None:
        self.columns = list(columns)

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return zip(*self.columns, strict=True)

    def column(self, index: int) -> list[Any]:
        return self.columns[index]

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        if isinstance(index, slice):
            return list(zip(*(column[index] for column in self.columns), strict=True))
        return tuple(column[index] for column in self.columns)


class ChunkedRows(Sequence[tuple[Any, ...]]):
    """Rows made a block at a time: ``chunk(start, end)`` gives the columns of rows
    ``start..end``, blocks in order.

    A loader then formats and sends one block while the server stores the one before, instead
    of reading every object before the first byte leaves (on PostgreSQL the server's COPY work
    is longer than the client's, so the client's reading is hidden behind it). :meth:`made`
    holds the blocks made so far, which is what an error report may name; reading the rows
    any other way makes the rest first.
    """

    __slots__ = ("_blocks", "_count", "_made_until", "_make")

    def __init__(self, count: int, make: Callable[[int, int], list[list[Any]]]) -> None:
        self._count = count
        self._make = make
        self._blocks: list[list[list[Any]]] = []
        self._made_until = 0

    def chunk(self, start: int, end: int) -> list[list[Any]]:
        if start != self._made_until:
            raise InvalidArgumentError(
                f"blocks are made in order: start={start}, but the next block starts at "
                f"{self._made_until}"
            )
        columns = self._make(start, min(end, self._count))
        self._blocks.append(columns)
        self._made_until = min(end, self._count)
        return columns

    def made(self) -> ColumnRows:
        if len(self._blocks) == 1:
            return ColumnRows(self._blocks[0])
        width = len(self._blocks[0]) if self._blocks else 0
        return ColumnRows(
            [[value for block in self._blocks for value in block[i]] for i in range(width)]
        )

    def _all(self) -> ColumnRows:
        if self._made_until < self._count:
            self.chunk(self._made_until, self._count)
        return self.made()

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._all())

    def column(self, index: int) -> list[Any]:
        return self._all().column(index)

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        return self._all()[index]
