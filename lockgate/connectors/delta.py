"""``DeltaSink``: exactly-once writes to a Delta Lake table with delta-rs.

Tasks stage Parquet files; when a checkpoint completes, task 0 makes one
Delta commit of them that carries an application transaction (``txn``:
app id ``lockgate/{job}/{sink uid}``, version = checkpoint id), which is how
Spark Structured Streaming makes ``foreachBatch`` writes idempotent. The
protocol is :mod:`lockgate.connectors.lakehouse`'s.

``mode="append"``: the staged files are moved into the table folder and
added as they are (no rewrite). ``mode="merge"``: the staged changes are
read, the last change per key kept, and applied with Delta ``MERGE``
(update or insert; a row whose ``delete_column`` is true deletes its key).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lockgate import fs
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
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
)
from lockgate.errors import ConfigurationError

__all__ = ["DeltaSink"]


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as e:  # pragma: no cover - the extra is installed in dev
        raise ConfigurationError(
            "DeltaSink needs the deltalake package: pip install 'lockgate[delta]'") from e
    return deltalake


def last_per_key(table: pa.Table, key: list[str]) -> pa.Table:
    """The last row of ``table`` for each value of ``key`` (row order kept)."""
    idx = pa.array(range(table.num_rows), pa.int64())
    grouped = table.select(key).append_column("__lockgate_i", idx) \
        .group_by(key, use_threads=False).aggregate([("__lockgate_i", "max")])
    keep = grouped.column("__lockgate_i_max")
    return table.take(keep.take(pc.sort_indices(keep)))


class DeltaTarget(LakeTable):
    """The Delta table at ``uri`` (a local path, or a URL for delta-rs with
    ``storage_options``); ``root``: its folder as a :mod:`lockgate.fs` location."""

    def __init__(self, uri: str, mode: str, key: list[str], delete_column: str | None,
                 uid: str, attempt: int = 0, storage_options: dict[str, str] | None = None,
                 root: str | None = None, partition_by: list[str] | None = None) -> None:
        self.partition_by = list(partition_by or [])
        self.attempt = attempt
        self.storage_options = storage_options
        self.root = root or uri
        self.uri = uri
        self.mode = mode
        self.key = key
        self.delete_column = delete_column
        self.uid = uid

    def _table(self) -> Any | None:
        dl = _deltalake()
        so = self.storage_options
        if not dl.DeltaTable.is_deltatable(self.uri, storage_options=so):
            return None
        return dl.DeltaTable(self.uri, storage_options=so)

    def committed_version(self, app: str) -> int | None:
        table = self._table()
        if table is None:
            return None
        v = table.transaction_version(app)
        return None if v is None else int(v)

    def _ensure_table(self, schema: pa.Schema, table: Any | None) -> Any:
        """``table`` (as loaded, None if there is none yet), made if missing
        and checked against the records' ``schema``."""
        dl = _deltalake()
        if table is None:
            fields = [f for f in schema if f.name != self.delete_column]
            table = dl.DeltaTable.create(self.uri, schema=pa.schema(fields), mode="ignore",
                                         partition_by=self.partition_by or None,
                                         storage_options=self.storage_options)
        check_columns(f"DeltaSink {self.uid!r}", fs.redact(self.uri),
                      [f.name for f in pa.schema(table.schema().to_arrow())], schema,
                      self.delete_column)
        check_partitioning(f"DeltaSink {self.uid!r}", fs.redact(self.uri),
                           list(table.metadata().partition_columns), self.partition_by)
        return table

    def _partitioned(self, table: Any | None) -> list[str]:
        """The partition columns of ``table`` (the sink's, for a new table)."""
        return self.partition_by if table is None else list(table.metadata().partition_columns)

    def commit(self, files: list[StagedFile], versions: dict[str, int],
               fault: Callable[[str], None]) -> None:
        dl = _deltalake()
        props = dl.CommitProperties(
            app_transactions=[dl.Transaction(app_id=a, version=v) for a, v in versions.items()],
            custom_metadata={"lockgate.sink": self.uid,
                             "lockgate.checkpoints": json.dumps(versions)})
        table = self._table()  # loaded once per commit
        if self.mode == "append" and not self._partitioned(table):
            self._append(files, props, fault, table)
        elif self.mode == "append":
            self._append_partitioned(files, props, fault, table)
        else:
            self._merge(files, versions, props, fault, table)

    def _append(self, files: list[StagedFile], props: Any, fault: Callable[[str], None],
                table: Any | None) -> None:
        """Step 1. Move each staged file into the table folder (a retry finds it there).
        Step 2. One commit adding them all, with the application transactions."""
        from deltalake.transaction import AddAction
        actions, schema = [], None
        now = int(time.time() * 1000)
        for f in files:
            final = fs.join(self.root, f.final_name)
            move_staged(f, final, self.uid)
            filesystem, path = fs.resolve(final)
            with filesystem.open_input_file(path) as data:
                size = data.size()
                meta = pq.read_metadata(data)
            schema = schema or meta.schema.to_arrow_schema()
            actions.append(AddAction(path=f.final_name, size=int(size), partition_values={},
                                     modification_time=now, data_change=True,
                                     stats=json.dumps({"numRecords": meta.num_rows})))
        fs.sync_dir(self.root)
        fault("table_commit")
        assert schema is not None
        table = self._ensure_table(schema, table)
        table.create_write_transaction(actions, mode="append", schema=table.schema(),
                                       commit_properties=props)

    def _append_partitioned(self, files: list[StagedFile], props: Any,
                            fault: Callable[[str], None], table: Any | None) -> None:
        """A partitioned table (Hive-style folders, ``col=value/``; the
        partition columns live in the log, not in the files):
        Step 1. Read the staged files.
        Step 2. One append (delta-rs splits the rows by partition) with the
                application transactions; files written before a kill and
                never committed are not in the table (``vacuum`` removes them).
        Step 3. Delete the staged files (a restore deletes any left)."""
        dl = _deltalake()
        rows = concat_staged(files, self.uid)
        table = self._ensure_table(rows.schema, table)
        fault("table_commit")
        dl.write_deltalake(table, rows.cast(pa.schema(table.schema().to_arrow())),
                           mode="append", partition_by=self._partitioned(table),
                           commit_properties=props)
        for f in files:
            fs.remove(f.path)

    def _merge(self, files: list[StagedFile], versions: dict[str, int], props: Any,
               fault: Callable[[str], None], table: Any | None) -> None:
        """Step 1. Read the staged changes in order, keep the last per key.
        Step 2. One MERGE with the application transactions (an empty commit
                carries them if the MERGE changed nothing).
        Step 3. Delete the staged files (a restore deletes any left)."""
        changes = last_per_key(concat_staged(files, self.uid), self.key)
        table = self._ensure_table(changes.schema, table)
        cols = [n for n in changes.schema.names if n != self.delete_column]
        on = " AND ".join(f"t.{k} = s.{k}" for k in self.key)
        set_all = {c: f"s.{c}" for c in cols}
        merger = table.merge(changes, predicate=on, source_alias="s", target_alias="t",
                             commit_properties=props)
        if self.delete_column:
            gone = f"s.{self.delete_column} = true"
            kept = f"s.{self.delete_column} = false"
            merger = (merger.when_matched_delete(predicate=gone)
                      .when_matched_update(updates=set_all, predicate=kept)
                      .when_not_matched_insert(updates=set_all, predicate=kept))
        else:
            merger = merger.when_matched_update(updates=set_all) \
                .when_not_matched_insert(updates=set_all)
        fault("table_commit")
        metrics = merger.execute()
        if not metrics.get("num_target_files_added") and not metrics.get(
                "num_target_files_removed"):
            self._record(versions, props)
        for f in files:
            fs.remove(f.path)

    def _record(self, versions: dict[str, int], props: Any) -> None:
        """A commit that changes no rows (a MERGE of deletes of keys the table
        does not hold) makes no Delta version: record the checkpoints in an
        empty one, if the table does not show them, so that a restore never
        looks for the staged files of a checkpoint it does not see."""
        table = self._table()
        assert table is not None
        recorded = {a: table.transaction_version(a) for a in versions}
        if any(recorded[a] is None or recorded[a] < v for a, v in versions.items()):
            table.create_write_transaction([], mode="append", schema=table.schema(),
                                           commit_properties=props)


class DeltaSink(Sink[Any]):
    """Exactly-once writes to the Delta table at ``path`` (created at the
    first commit if missing): one Delta commit per completed checkpoint."""

    exactly_once = True

    def __init__(self, path: str, mode: str = "append", key: list[str] | str | None = None,
                 delete_column: str | None = None, schema: pa.Schema | None = None,
                 storage_options: dict[str, str] | None = None,
                 staging: str | None = None,
                 partition_by: list[str] | str | None = None) -> None:
        """``path``: the table's folder (a local path, or a URL such as
        ``s3://bucket/table`` with delta-rs ``storage_options``); ``mode``:
        ``"append"`` or ``"merge"`` (upsert by ``key``; rows whose
        ``delete_column`` is true delete their key); ``schema``: the records'
        Arrow schema (default: the first batch's); ``staging``: where tasks
        stage their files, a :mod:`lockgate.fs` location in the table's
        filesystem (default and local: ``<path>/_lockgate``; needed for a URL);
        ``partition_by``: the partition columns of a new table (Hive-style
        folders ``col=value/``); an existing table keeps its own, which must
        then be these."""
        keys = key_columns("DeltaSink", mode, key, delete_column, schema)
        if fs.local_path(path) is None and staging is None:
            raise ConfigurationError(
                f"DeltaSink: {fs.redact(path)} is not a local path; give staging=..., a "
                "Lockgate storage URL in the table's bucket (with its credentials), and "
                "storage_options for delta-rs")
        self.partition_by = partition_columns("DeltaSink", partition_by, keys, delete_column,
                                              schema)
        local = fs.local_path(path)
        self.path = fs.absolute(path) if local is not None else path
        self.storage_options = storage_options
        self.staging = staging
        self.root = self.path if staging is None else beside(staging, self.path)
        self.mode = mode
        self.key = keys
        self.delete_column = delete_column
        self.schema = schema

    def validate(self) -> None:
        """The deltalake package is there; the folder can be created and
        written; an existing table has the key columns."""
        from lockgate.connectors.filesink import ensure_writable_dir
        dl = _deltalake()
        ensure_writable_dir(self.staging or self.path, ".lockgate-probe-driver")
        so = self.storage_options
        if dl.DeltaTable.is_deltatable(self.path, storage_options=so):
            table = dl.DeltaTable(self.path, storage_options=so)
            names = pa.schema(table.schema().to_arrow()).names
            missing = [k for k in self.key + self.partition_by if k not in names]
            if missing:
                raise ConfigurationError(
                    f"DeltaSink: the table {fs.redact(self.path)} has no column(s) {missing} "
                    f"(it has {names}); fix key=... or partition_by=...")
            check_partitioning("DeltaSink", fs.redact(self.path),
                               list(table.metadata().partition_columns), self.partition_by)

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        target = DeltaTarget(self.path, self.mode, self.key, self.delete_column, info.uid,
                             info.attempt, self.storage_options, self.root, self.partition_by)
        return LakeSinkWriter(info, self.root, target, self.schema, staging=self.staging)

    def __repr__(self) -> str:
        parts = f", partition_by={self.partition_by!r}" if self.partition_by else ""
        return f"DeltaSink({self.path!r}, mode={self.mode!r}, key={self.key!r}{parts})"
