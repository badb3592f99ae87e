"""The plumbing every snowflake_db Alembic operation shares: one field list per operation.

An operation is a dataclass of its arguments (the "entity" of alembic_utils' entity +
ReversibleOp pattern): that one declaration gives the constructor, the ``op.<name>(...)`` method
Alembic registers, the renderer autogenerate writes into revision files, and the arguments a
``reverse()`` carries over to its opposite. (See "Operation Plugins" in the Alembic docs.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from alembic.autogenerate import renderers
from alembic.operations import MigrateOperation, Operations

from ...errors import SnowflakeMigrationError
from ...layout import DEFAULT_LAYOUT, Layout

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext
    from sqlalchemy.engine import Connection

_Op = TypeVar("_Op", bound="SnowflakeOp")

#: ``field(metadata=NOT_RENDERED)``: an argument only ``reverse()`` uses, not ``op.<name>``'s.
NOT_RENDERED = {"render": False}


@dataclasses.dataclass(eq=False)
class SnowflakeOp(MigrateOperation):
    """Base of the operations: the dataclass fields are the ``op.<name>(...)`` arguments.

    Fields before ``KW_ONLY`` are positional; a field at its default is left out when rendered.
    """

    #: The ``op.<name>`` this operation is registered as (set by :func:`operation`).
    op_name: ClassVar[str]

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments that rebuild this operation, defaults left out."""
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            if not spec.init or not spec.metadata.get("render", True):
                continue
            value = getattr(self, spec.name)
            if spec.kw_only:
                if not _is_default(spec, value):
                    keywords[spec.name] = value
            else:
                positional.append((spec, value))
        # A trailing positional at its default may go; one before a given one must stay.
        while positional and _is_default(*positional[-1]):
            positional.pop()
        return [value for _, value in positional], keywords

    def carry(self, other: type[_Op], **renames: str) -> _Op:
        """``other`` built from this operation's fields of the same name (``renames`` maps a
        field of this one to a differently named field of ``other``)."""
        wanted = {spec.name for spec in dataclasses.fields(other) if spec.init}
        values = {}
        for spec in dataclasses.fields(self):
            name = renames.get(spec.name, spec.name)
            if spec.init and name in wanted:
                values[name] = getattr(self, spec.name)
        return other(**values)


def operation(name: str) -> Callable[[type[_Op]], type[_Op]]:
    """Register a :class:`SnowflakeOp` subclass as ``op.<name>`` and render it as such.

    The ``op.<name>`` method passes its arguments to the dataclass constructor; its help text
    is the class docstring.
    """

    def register(op_cls: type[_Op]) -> type[_Op]:
        def invoke(cls: type[_Op], operations: Operations, *args: Any, **kwargs: Any) -> Any:
            return operations.invoke(cls(*args, **kwargs))

        invoke.__name__ = invoke.__qualname__ = name
        invoke.__doc__ = op_cls.__doc__
        op_cls.op_name = name
        setattr(op_cls, name, classmethod(invoke))
        Operations.register_operation(name)(op_cls)
        renderers.dispatch_for(op_cls)(_render)
        return op_cls

    return register


def postgresql_bind(operations: Operations, what: str, needs: str, feature: str) -> Connection:
    """The migration's connection, refusing offline mode and databases other than PostgreSQL."""
    if operations.migration_context.as_sql:
        raise SnowflakeMigrationError(f"{what} {needs} and cannot run in offline --sql mode")
    bind = operations.get_bind()
    if bind.dialect.name != "postgresql":
        raise SnowflakeMigrationError(
            f"{what} {feature}: PostgreSQL only, not {bind.dialect.name}"
        )
    return bind


def _is_default(spec: dataclasses.Field[Any], value: Any) -> bool:
    if value == spec.default:
        return True
    # A layout argument defaulting to None means the default layout.
    return spec.default is None and isinstance(value, Layout) and value == DEFAULT_LAYOUT


def _render(autogen_context: AutogenContext, op: SnowflakeOp) -> str:
    autogen_context.imports.add("import snowflake_db.alembic")
    positional, keywords = op.arguments()
    parts = [_source(autogen_context, value) for value in positional]
    parts += [f"{key}={_source(autogen_context, value)}" for key, value in keywords.items()]
    return f"op.{op.op_name}({', '.join(parts)})"


def _source(autogen_context: AutogenContext, value: Any) -> str:
    """Python source that rebuilds ``value`` in a revision file (adding its import)."""
    if isinstance(value, Layout):
        autogen_context.imports.add("import snowflake_db")
        defaults = DEFAULT_LAYOUT.as_kwargs()
        fields = {
            name: number
            for name, number in value.as_kwargs().items()
            if number != defaults[name]
        }
        inner = ", ".join(f"{key}={number!r}" for key, number in fields.items())
        return f"snowflake_db.Layout({inner})"
    if isinstance(value, date | datetime):
        autogen_context.imports.add("import datetime")
    return repr(value)
