"""What the PostgreSQL sinks share: the client library (imported lazily, so
that ``import lockgate`` never needs it), connections, and the target table:
its name, its columns and how a record becomes a row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lockgate.errors import ConfigurationError, LockgateError
from lockgate.redact import redact

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["import_psycopg", "redact_dsn", "connect", "Target"]

INSTALL = "pip install 'lockgate[postgres]'"


def import_psycopg() -> Any:
    """The ``psycopg`` module, or a ConfigurationError naming the extra to install."""
    try:
        import psycopg
    except ImportError as e:
        raise ConfigurationError(
            f"the PostgreSQL connectors need psycopg 3 ({e}): {INSTALL}") from e
    return psycopg


def redact_dsn(dsn: str) -> str:
    """``dsn`` without its password (for messages and logs): quoted
    (``password='two words'``), plain, or in a URL (:func:`lockgate.redact.redact`)."""
    return redact(dsn)


def connect(dsn: str, *, autocommit: bool, application_name: str) -> psycopg.Connection[Any]:
    """A connection to ``dsn``; a ConfigurationError naming the server if it
    cannot be made."""
    pg = import_psycopg()
    try:
        conn: psycopg.Connection[Any] = pg.connect(
            dsn, autocommit=autocommit, application_name=application_name[:63],
            connect_timeout=10)
    except pg.Error as e:
        raise ConfigurationError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)!r}: "
            f"{str(e).strip() or type(e).__name__}") from e
    return conn


class Target:
    """A table and the columns records are written to.

    Args:
        table: ``"name"`` or ``"schema.name"`` (each part an identifier, quoted).
        columns: the columns, in the order of a tuple record; ``None``: every
            column of the table, in its order (read once per writer).
    """

    def __init__(self, table: str, columns: Sequence[str] | None) -> None:
        parts = table.split(".")
        if not table or len(parts) > 2 or not all(parts):
            raise ConfigurationError(
                f"PostgreSQL table {table!r}: give 'table' or 'schema.table'")
        if columns is not None and (not columns or not all(isinstance(c, str) and c
                                                           for c in columns)):
            raise ConfigurationError(f"PostgreSQL table {table!r}: columns must be a non-empty "
                                     f"list of column names, got {columns!r}")
        self.table = table
        self.parts = tuple(parts)
        self.columns: tuple[str, ...] | None = tuple(columns) if columns is not None else None

    def table_sql(self) -> sql.Composable:
        """The table's quoted name."""
        from psycopg import sql

        return sql.Identifier(*self.parts)

    def columns_sql(self, columns: Sequence[str] | None = None) -> sql.Composable:
        """``"a", "b", ...``: the quoted column list."""
        from psycopg import sql

        return sql.SQL(", ").join(sql.Identifier(c) for c in (columns or self.known_columns))

    @property
    def known_columns(self) -> tuple[str, ...]:
        if self.columns is None:
            raise LockgateError(f"the columns of {self.table!r} are not known yet")
        return self.columns

    def resolve(self, conn: psycopg.Connection[Any]) -> None:
        """Check that the table and the columns exist (a ConfigurationError
        that names what is missing); read the columns if none were given."""
        qualified = ".".join('"' + p.replace('"', '""') + '"' for p in self.parts)
        row = conn.execute("SELECT to_regclass(%s)::oid", (qualified,)).fetchone()
        if row is None or row[0] is None:
            raise ConfigurationError(
                f"PostgreSQL table {self.table!r} does not exist in this database: create it "
                "before the job starts (the sinks never create or alter tables)")
        existing = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum", (row[0],)).fetchall()]
        if self.columns is None:
            self.columns = tuple(existing)
            return
        missing = [c for c in self.columns if c not in existing]
        if missing:
            raise ConfigurationError(
                f"PostgreSQL table {self.table!r} has no column(s) {missing}; "
                f"its columns are {existing}")

    def rows(self, batch: list[Any]) -> list[Sequence[Any]]:
        """The rows of ``batch``: a dict by column name (a missing column is
        NULL), a tuple or list in column order, anything else as the one
        column of a one-column table."""
        columns = self.known_columns
        n = len(columns)
        if all(type(r) is tuple and len(r) == n for r in batch):
            return batch  # the common case, checked in one pass
        rows: list[Sequence[Any]] = []
        for r in batch:
            if isinstance(r, dict):
                rows.append(tuple(r.get(c) for c in columns))
            elif isinstance(r, tuple | list) and len(r) == n:
                rows.append(r)
            elif n == 1 and not isinstance(r, tuple | list):
                rows.append((r,))
            else:
                self._bad(r)
        return rows

    def _bad(self, record: Any) -> Any:
        raise LockgateError(
            f"PostgreSQL sink: record {record!r:.200} does not fit the columns "
            f"{list(self.known_columns)} of {self.table!r}: give a dict by column name or a "
            "tuple with one value per column")
