"""``IcebergSink``: exactly-once writes to an Apache Iceberg table with pyiceberg.

Tasks stage Parquet files; when a checkpoint completes, task 0 makes one
table commit of them (one new metadata version, swapped atomically in the
catalog) whose snapshot summary carries ``lockgate.checkpoint.<app id>`` =
checkpoint id (app id ``lockgate/{job}/{sink uid}``), as Flink's
``IcebergFilesCommitter`` records its job, operator and checkpoint id. The
protocol is :mod:`lockgate.connectors.lakehouse`'s.

``mode="append"``: the staged files are moved into the table's ``data/``
folder and added as they are (``add_files``: no rewrite). ``mode="merge"``:
the staged changes are read, the last change per key kept, and applied in
one transaction: the rows of the changed keys that the table holds are
deleted (copy-on-write of the files that hold them), then the changed rows
that are not deletes (``delete_column`` false) appended.
"""

from __future__ import annotations

import functools
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lockgate import fs
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.delta import last_per_key
from lockgate.connectors.lakehouse import (
    LakeSinkWriter,
    LakeTable,
    StagedFile,
    beside,
    check_columns,
    check_partitioning,
    concat_staged,
    key_columns,
    move_staged,
    partition_columns,
    plain_uri,
    read_parquet_schema,
    require_lost,
    safe,
)
from lockgate.errors import ConfigurationError

__all__ = ["IcebergSink"]

SUMMARY_PREFIX = "lockgate.checkpoint."


def _catalog(name: str, properties: dict[str, str]) -> Any:
    try:
        from pyiceberg.catalog import load_catalog
    except ImportError as e:  # pragma: no cover - the extra is installed in dev
        raise ConfigurationError(
            "IcebergSink needs the pyiceberg package: pip install 'lockgate[iceberg]'") from e
    return load_catalog(name, **properties)


def committed_in(snapshots: list[Any], app: str) -> int | None:
    """The newest checkpoint id that ``snapshots``' summaries record for ``app``."""
    found = None
    for snap in snapshots:
        summary = snap.summary
        value = summary.get(SUMMARY_PREFIX + app) if summary is not None else None
        if value is not None and str(value).isdigit():
            found = max(found or 0, int(value))
    return found


def partitioned_by(table: Any) -> list[str]:
    """The identity partition columns of an Iceberg table, or a
    ``ConfigurationError`` for another transform (which the sink does not
    write)."""
    columns = []
    for field in table.spec().fields:
        if str(field.transform) != "identity":
            raise ConfigurationError(
                f"IcebergSink: the table {table.name()} has the partition field {field.name} "
                f"({field.transform}); the sink writes identity partitions only: write to a "
                "table partitioned by columns (partition_by=[...])")
        columns.append(table.schema().find_column_name(field.source_id))
    return columns


class IcebergTarget(LakeTable):
    """The Iceberg table ``identifier`` of the catalog ``properties``."""

    def __init__(self, catalog_name: str, properties: dict[str, str], identifier: str,
                 mode: str, key: list[str], delete_column: str | None, uid: str,
                 attempt: int = 0, partition_by: list[str] | None = None) -> None:
        self.partition_by = list(partition_by or [])
        self.catalog_name = catalog_name
        self.properties = properties
        self.identifier = identifier
        self.mode = mode
        self.key = key
        self.delete_column = delete_column
        self.uid = uid
        self.attempt = attempt

    @functools.cached_property
    def catalog(self) -> Any:
        return _catalog(self.catalog_name, self.properties)

    def _table(self) -> Any | None:
        if not self.catalog.table_exists(self.identifier):
            return None
        return self.catalog.load_table(self.identifier)

    def committed_version(self, app: str) -> int | None:
        table = self._table()
        return None if table is None else committed_in(table.metadata.snapshots, app)

    def _ensure_table(self, schema: pa.Schema, table: Any | None) -> Any:
        """``table`` (as loaded, None if there is none yet), made if missing
        and checked against the records' ``schema``."""
        if table is None:
            namespace = self.identifier.rsplit(".", 1)[0]
            self.catalog.create_namespace_if_not_exists(namespace)
            fields = pa.schema([f for f in schema if f.name != self.delete_column])
            if not self.partition_by:
                table = self.catalog.create_table_if_not_exists(self.identifier, schema=fields)
            else:
                table = self._create_partitioned(fields)
        check_columns(f"IcebergSink {self.uid!r}", self.identifier,
                      [f.name for f in table.schema().fields], schema, self.delete_column)
        check_partitioning(f"IcebergSink {self.uid!r}", self.identifier,
                           partitioned_by(table), self.partition_by)
        return table

    def _create_partitioned(self, schema: pa.Schema) -> Any:
        """The table with an identity partition spec on ``partition_by``, made
        in one catalog commit (a table another task made meanwhile is taken)."""
        from pyiceberg.exceptions import TableAlreadyExistsError
        try:
            with self.catalog.create_table_transaction(self.identifier, schema=schema) as tx:
                with tx.update_spec() as spec:
                    for column in self.partition_by:
                        spec.add_identity(column)
        except TableAlreadyExistsError:
            pass
        return self.catalog.load_table(self.identifier)

    def commit(self, files: list[StagedFile], versions: dict[str, int],
               fault: Callable[[str], None]) -> None:
        props = {SUMMARY_PREFIX + a: str(v) for a, v in versions.items()}
        props["lockgate.sink"] = self.uid
        props["lockgate.commit"] = uuid.uuid4().hex  # one per table commit
        table = self._table()  # loaded once per commit
        partitioned = bool(self.partition_by if table is None else partitioned_by(table))
        if self.mode == "append" and not partitioned:
            self._append(files, props, fault, table)
        elif self.mode == "append":
            self._append_partitioned(files, props, fault, table)
        else:
            self._merge(files, props, fault, table)

    def _append(self, files: list[StagedFile], props: dict[str, str],
                fault: Callable[[str], None], table: Any | None) -> None:
        """Step 1. Move each staged file into the table's data folder.
        Step 2. One commit adding them all (``add_files``), the checkpoint in
                the snapshot summary."""
        schema = None
        for f in files:
            if fs.exists(f.path):
                schema = schema or read_parquet_schema(f.path)
        table = self._ensure_table(schema, table) if schema is not None else table
        if table is None:
            raise require_lost(files[0].path, self.uid)
        data = fs.join(beside(files[0].path, table.location()), "data")
        fs.makedirs(data)
        paths = []
        for f in files:
            final = fs.join(data, f.final_name)
            move_staged(f, final, self.uid)
            paths.append(plain_uri(final))
        fs.sync_dir(data)
        fault("table_commit")
        table.add_files(paths, snapshot_properties=props, check_duplicate_files=False)

    def _append_partitioned(self, files: list[StagedFile], props: dict[str, str],
                            fault: Callable[[str], None], table: Any | None) -> None:
        """A partitioned table (each data file holds one partition):
        Step 1. Read the staged files.
        Step 2. One append (pyiceberg splits the rows by partition), the
                checkpoint in the snapshot summary; files written before a
                kill and never committed are not in the table.
        Step 3. Delete the staged files (a restore deletes any left)."""
        rows = concat_staged(files, self.uid)
        table = self._ensure_table(rows.schema, table)
        fault("table_commit")
        with table.transaction() as tx:
            tx.append(rows.cast(table.schema().as_arrow()), snapshot_properties=props)
        for f in files:
            fs.remove(f.path)

    def _merge(self, files: list[StagedFile], props: dict[str, str],
               fault: Callable[[str], None], table: Any | None) -> None:
        """Step 1. Read the staged changes in order, keep the last per key.
        Step 2. Find which of their keys the table holds (its key columns
                read, only from the files whose statistics may hold them).
        Step 3. One transaction: delete the rows of those keys (copy-on-write
                of the files that hold them), append the changed rows that
                are not deletes (an empty append if nothing else makes a
                snapshot: one records the checkpoint).
        Step 4. Delete the staged files (a restore deletes any left)."""
        changes = last_per_key(concat_staged(files, self.uid), self.key)
        table = self._ensure_table(changes.schema, table)
        keys = changes.select(self.key)
        held = held_keys(table, keys)
        if self.delete_column:
            gone = changes.column(self.delete_column).fill_null(False)
            changes = changes.filter(pc.invert(gone)).drop_columns([self.delete_column])
        fault("table_commit")
        with table.transaction() as tx:
            if held.num_rows:
                with warnings.catch_warnings():  # rows another writer deleted meanwhile
                    warnings.filterwarnings("ignore", "Delete operation did not match")
                    tx.delete(match_filter(held), snapshot_properties=props)
            if changes.num_rows or not held.num_rows:  # a snapshot records the checkpoint
                tx.append(changes.cast(table.schema().as_arrow()), snapshot_properties=props)
        for f in files:
            fs.remove(f.path)


def key_bounds(keys: pa.Table) -> list[Any]:
    """``column >= min AND column <= max`` for each key column of ``keys``
    (pyiceberg skips the files whose statistics lie outside)."""
    from pyiceberg import expressions

    ex: Any = expressions  # pydantic models: their positional signatures are not typed
    out: list[Any] = []
    for name in keys.column_names:
        column = keys.column(name)
        bounds = pc.min_max(column)
        if column.null_count == 0 and bounds["min"].is_valid:
            out += [ex.GreaterThanOrEqual(name, bounds["min"].as_py()),
                    ex.LessThanOrEqual(name, bounds["max"].as_py())]
    return out


def held_keys(table: Any, keys: pa.Table) -> pa.Table:
    """The distinct rows of ``keys`` that ``table`` holds: its key columns
    read (only those), from the files whose statistics may hold them, and
    matched in Arrow (a null never matches, as in SQL)."""
    from pyiceberg import expressions

    ex: Any = expressions  # pydantic models: their positional signatures are not typed
    if table.current_snapshot() is None or not keys.num_rows:
        return keys.schema.empty_table()
    bounds = key_bounds(keys)
    scan = table.scan(row_filter=balanced(ex.And, bounds) if bounds else ex.AlwaysTrue(),
                      selected_fields=tuple(keys.column_names))
    existing = scan.to_arrow().cast(keys.schema)
    if not existing.num_rows:
        return keys.schema.empty_table()
    names = keys.column_names
    distinct = keys.group_by(names, use_threads=False).aggregate([])
    return distinct.join(existing.group_by(names, use_threads=False).aggregate([]),
                         keys=names, join_type="left semi", use_threads=False)


def match_filter(keys: pa.Table) -> Any:
    """A pyiceberg expression true for the rows whose key is a row of
    ``keys`` (distinct, no nulls): ``In`` on the last key column for each
    value of the others (one ``In`` for a one-column key), their ``Or`` as
    a balanced tree, and each key column's range (files outside it are not
    read)."""
    from pyiceberg import expressions

    ex: Any = expressions  # pydantic models: their positional signatures are not typed
    names = keys.column_names
    last = names[-1]
    if len(names) == 1:
        branches = [ex.In(last, keys.column(last).to_pylist())]
    else:
        groups = keys.group_by(names[:-1], use_threads=False).aggregate([(last, "list")])
        branches = [balanced(ex.And, [*(ex.EqualTo(c, v) for c, v in prefix.items()),
                                      ex.In(last, values)])
                    for prefix, values in zip(groups.select(names[:-1]).to_pylist(),
                                              groups.column(f"{last}_list").to_pylist(),
                                              strict=True)]
    return balanced(ex.And, [*key_bounds(keys), balanced(ex.Or, branches)])


def balanced(op: Any, parts: list[Any]) -> Any:
    """``op`` (pyiceberg's ``And``, ``Or``) of ``parts`` as a balanced tree:
    pyiceberg's visitors recurse, and a chain of thousands overflows the stack."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return op(balanced(op, parts[:mid]), balanced(op, parts[mid:]))


class IcebergSink(Sink[Any]):
    """Exactly-once writes to the Iceberg table ``table`` (``"namespace.name"``,
    created at the first commit if missing) of a pyiceberg catalog: one table
    commit per completed checkpoint."""

    exactly_once = True

    def __init__(self, table: str, catalog: dict[str, str], mode: str = "append",
                 key: list[str] | str | None = None, delete_column: str | None = None,
                 schema: pa.Schema | None = None, catalog_name: str = "lockgate",
                 staging: str | None = None,
                 partition_by: list[str] | str | None = None) -> None:
        """``table``: ``"namespace.name"``; ``catalog``: pyiceberg catalog
        properties (e.g. ``{"type": "sql", "uri": "sqlite:////abs/catalog.db",
        "warehouse": "file:///abs/warehouse"}``); ``mode``: ``"append"`` or
        ``"merge"`` (upsert by ``key``; rows whose ``delete_column`` is true
        delete their key); ``schema``: the records' Arrow schema (default: the
        first batch's); ``staging``: the folder for the tasks' staged files
        (default: ``_lockgate/<table>`` under a local warehouse);
        ``partition_by``: the columns of a new table's identity partition
        spec; an existing table keeps its own, which must then be these."""
        if "." not in table:
            raise ConfigurationError(
                f"IcebergSink: table {table!r} has no namespace; name it \"namespace.name\"")
        keys = key_columns("IcebergSink", mode, key, delete_column, schema)
        self.partition_by = partition_columns("IcebergSink", partition_by, keys, delete_column,
                                              schema)
        if staging is None:
            warehouse = str(catalog.get("warehouse", ""))
            if not warehouse or fs.local_path(warehouse) is None:
                raise ConfigurationError(
                    f"IcebergSink: the catalog's warehouse {warehouse!r} is not a local "
                    "folder; give staging=... (a folder every task can reach)")
            staging = fs.join(fs.local_path(warehouse) or warehouse, "_lockgate", safe(table))
        self.table = table
        self.catalog = dict(catalog)
        self.catalog_name = catalog_name
        self.mode = mode
        self.key = keys
        self.delete_column = delete_column
        self.schema = schema
        self.staging = fs.absolute(staging)

    def _target(self, uid: str, attempt: int = 0) -> IcebergTarget:
        return IcebergTarget(self.catalog_name, self.catalog, self.table, self.mode, self.key,
                             self.delete_column, uid, attempt, self.partition_by)

    def validate(self) -> None:
        """pyiceberg is there; the catalog answers; the staging folder can be
        written; an existing table has the key columns."""
        from lockgate.connectors.filesink import ensure_writable_dir
        ensure_writable_dir(self.staging, ".lockgate-probe-driver")
        try:
            table = self._target("driver")._table()
        except ConfigurationError:
            raise
        except Exception as e:
            raise ConfigurationError(
                f"IcebergSink: the catalog does not answer ({type(e).__name__}: {e}); fix "
                "the catalog properties") from e
        if table is not None:
            names = [f.name for f in table.schema().fields]
            missing = [k for k in self.key + self.partition_by if k not in names]
            if missing:
                raise ConfigurationError(
                    f"IcebergSink: the table {self.table} has no column(s) {missing} "
                    f"(it has {names}); fix key=... or partition_by=...")
            check_partitioning("IcebergSink", self.table, partitioned_by(table),
                               self.partition_by)

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        return LakeSinkWriter(info, self.staging, self._target(info.uid, info.attempt),
                              self.schema, staging=self.staging)

    def __repr__(self) -> str:
        parts = f", partition_by={self.partition_by!r}" if self.partition_by else ""
        return f"IcebergSink({self.table!r}, mode={self.mode!r}, key={self.key!r}{parts})"
