"""A bounded, replayable source that reads a Spark DataFrame.

A DataFrame is a recipe, not data: evaluated twice it may give other rows
(a table that changed, a non-deterministic shuffle). So at job start the
driver **materializes** it once, with Spark, as Parquet under the job's folder
in checkpoint storage::

    <storage>/<job-id>/inputs/<uid>/part-00000.parquet   one per non-empty Spark partition
    <storage>/<job-id>/inputs/<uid>/part-00003.parquet   (empty partitions have no file)
    <storage>/<job-id>/inputs/<uid>/_LOCKGATE_INPUT      written last: the copy is complete

and the tasks read that copy with the :class:`~lockgate.connectors.FileSource`
machinery: a split per file, checkpointed as ``{file, row index}``, file of
Spark partition ``n`` read by task ``n % parallelism`` — so the tasks read in
parallel. Every restart of the job replays the same copy (the job master
materializes once per job, before the first attempt), so exactly-once holds even
for a DataFrame that would not give the same rows twice. A driver started again
with the same ``job_id`` reuses a complete copy it finds.

A *new* job restored from a savepoint (or from another job's checkpoint)
materializes the DataFrame again, and its restored positions are file names and
row indexes: the DataFrame must then give the same rows, in the same order, in
the same partitions (a table snapshot, a fixed file listing, ``orderBy`` ...);
a missing partition file fails the restore with a clear error.

Records are one ``dict`` per row, ``{column: value}``, converted from Parquet by
pyarrow, with exact types: integral columns give ``int`` (never ``float``),
``double``/``float`` give ``float``, decimals ``decimal.Decimal``, strings
``str``, binary ``bytes``, dates ``datetime.date``, timestamps timezone-aware
``datetime.datetime`` in UTC (``TIMESTAMP_NTZ``: naive), arrays ``list``,
structs ``dict``, maps a ``list`` of ``(key, value)`` tuples, nulls ``None``.

Spark writes the Parquet files (``df.write.parquet``) into a hidden staging
folder next to the target, then Lockgate renames them to their deterministic
names: the storage location must be writable by Spark too. ``s3://`` storage is
given to Spark as ``s3a://`` (configure Spark's S3A filesystem for it).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from lockgate import fs
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.filesource import FileSource, FileSourceReader
from lockgate.errors import ConfigurationError, LockgateError, PipelineDefinitionError

__all__ = [
    "DataFrameSource",
    "DataFrameSourceReader",
    "INPUTS_FOLDER",
    "MARKER",
    "materialize_dataframe",
    "partition_of_file",
    "plan_part_names",
]

log = logging.getLogger("lockgate.driver")

INPUTS_FOLDER = "inputs"
"""The folder of materialized inputs under a job's checkpoint folder."""
MARKER = "_LOCKGATE_INPUT"
"""Written last into a materialized copy (hidden from readers: leading ``_``)."""
_TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"
_SPARK_PART_RE = re.compile(
    r"^part-(?P<part>\d+)-.*?(?:-c(?P<file>\d+))?(?:\.[A-Za-z0-9]+)*\.parquet$"
)
_OUR_PART_RE = re.compile(r"^part-(?P<part>\d+)(?:-c\d+)?\.parquet$")


def plan_part_names(names: list[str]) -> list[tuple[str, str]]:
    """``(spark name, deterministic name)`` for the Parquet files Spark wrote.

    Spark names a file ``part-<partition>-<write uuid>-c<n>.<codec>.parquet``;
    it becomes ``part-<partition>.parquet``, or ``part-<partition>-c<n>.parquet``
    for every file when some partition was written as several files
    (``maxRecordsPerFile``), so that name order is row order. Hidden names
    (``_SUCCESS``, ``.crc`` files) are skipped. Pure."""
    parts: list[tuple[int, int, str]] = []
    for name in names:
        if name.startswith((".", "_")):
            continue
        m = _SPARK_PART_RE.match(name)
        if m is None:
            raise LockgateError(
                f"materializing a DataFrame: Spark wrote the unexpected file {name!r}; "
                "only part-*.parquet files were expected (was the DataFrame written with "
                "partitionBy or bucketing settings?)"
            )
        parts.append((int(m.group("part")), int(m.group("file") or 0), name))
    parts.sort()
    multi = len({p for p, _, _ in parts}) != len(parts)
    return [(name, f"part-{p:05d}-c{c:03d}.parquet" if multi else f"part-{p:05d}.parquet")
            for p, c, name in parts]


def partition_of_file(relname: str) -> int:
    """The Spark partition number of a materialized file name."""
    m = _OUR_PART_RE.match(relname)
    if m is None:
        raise LockgateError(
            f"DataFrame source: {relname!r} is not a materialized partition file "
            "(part-NNNNN.parquet); do not put other files in the inputs folder"
        )
    return int(m.group("part"))


def spark_location(location: str) -> str:
    """The location as Spark's Hadoop filesystems name it: a local path stays,
    ``s3://bucket/key?options`` becomes ``s3a://bucket/key`` (no options)."""
    local = fs.local_path(location)
    if local is not None:
        return local
    scheme, _, rest = location.partition("://")
    rest = rest.split("?", 1)[0]
    if "@" in rest.split("/", 1)[0]:
        raise ConfigurationError(
            "a DataFrame source is materialized by Spark, which cannot take credentials in "
            "the storage URL: configure them in Spark (spark.hadoop.fs.s3a.*) and the "
            "environment instead"
        )
    return f"{'s3a' if scheme == 's3' else scheme}://{rest}"


def materialize_dataframe(df: Any, folder: str) -> list[str]:
    """Write ``df`` once as Parquet into ``folder``; return the file names.

    Step 1. A complete copy (``_LOCKGATE_INPUT`` present) is reused as it is.
    Step 2. Spark writes the DataFrame into a hidden staging folder next to
            ``folder`` (timestamps as TIMESTAMP_MICROS, not INT96, so that they
            read back exactly).
    Step 3. Its part files are renamed to ``part-NNNNN.parquet`` in ``folder``.
    Step 4. ``_LOCKGATE_INPUT`` is written atomically: the copy is complete.
    """
    marker = fs.join(folder, MARKER)
    # Step 1. Reuse.
    if fs.exists(marker):
        files = json.loads(fs.read_bytes(marker))["files"]
        log.info("reusing the materialized DataFrame in %s (%d files)", fs.redact(folder),
                 len(files))
        return list(files)
    fs.rmtree(folder)  # an interrupted earlier copy of this job
    # Step 2. Spark writes.
    staging = fs.join(fs.parent(folder), f".staging-{fs.basename(folder)}-{uuid.uuid4().hex[:8]}")
    spark = df.sparkSession
    started = time.monotonic()
    old = spark.conf.get(_TIMESTAMP_CONF)
    spark.conf.set(_TIMESTAMP_CONF, "TIMESTAMP_MICROS")
    try:
        df.write.mode("errorifexists").parquet(spark_location(staging))
    except Exception as e:
        fs.rmtree(staging)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigurationError(
            f"materializing the DataFrame source into {fs.redact(folder)} failed: {first}. "
            "The checkpoint storage must be writable by Spark (and the DataFrame must be "
            "computable); see docs/spark.md"
        ) from e
    finally:
        spark.conf.set(_TIMESTAMP_CONF, old)
    # Step 3. Deterministic names.
    renames = plan_part_names(fs.listdir(staging))
    fs.makedirs(folder)
    for src, dst in renames:
        fs.move(fs.join(staging, src), fs.join(folder, dst))
    fs.sync_dir(folder)
    fs.rmtree(staging)
    # Step 4. Complete.
    files = [dst for _, dst in renames]
    fs.write_atomic(marker, json.dumps({"files": files, "written_at": time.time()}).encode())
    log.info("materialized the DataFrame source into %s: %d files in %.1f s",
             fs.redact(folder), len(files), time.monotonic() - started)
    return files


class DataFrameSourceReader(FileSourceReader):
    """A :class:`FileSourceReader` over a materialized DataFrame: the files of
    Spark partition ``n`` belong to task ``n % parallelism`` (balanced, unlike
    the file source's hash of the name)."""

    def _mine(self, rel: str) -> bool:
        return partition_of_file(rel) % self.info.parallelism == self.info.task_index


class DataFrameSource(Source[dict[str, Any]]):
    """The rows of a Spark DataFrame (or table), one ``dict`` per row; see the
    module docstring. Use :meth:`lockgate.Pipeline.source_dataframe`."""

    replayable = True
    bounded = True
    operator_state_mode = OperatorStateMode.UNION  # the file source's per-file entries

    def __init__(self, df: Any, *, spark: Any = None) -> None:
        """``df``: a pyspark DataFrame, or a table name (with ``spark``, the
        session to read it from; default the active one)."""
        if isinstance(df, str):
            if spark is None:
                from pyspark.sql import SparkSession

                spark = SparkSession.getActiveSession()
            if spark is None:
                raise PipelineDefinitionError(
                    f"source_dataframe({df!r}): a table name needs a SparkSession; pass "
                    "spark=<session> or start one first"
                )
            self.table: str | None = df
            df = spark.table(df)
        else:
            self.table = None
        if not (hasattr(df, "write") and hasattr(df, "sparkSession") and hasattr(df, "columns")):
            raise PipelineDefinitionError(
                f"source_dataframe: {type(df).__name__} is not a Spark DataFrame; pass a "
                "pyspark.sql.DataFrame or a table name"
            )
        self._df: Any = df
        self.path: str | None = None
        """The materialized copy (set in the driver by :meth:`prepare`)."""

    def task_modules(self) -> tuple[str, ...]:
        return ("pyarrow.parquet",)  # its copy is in the checkpoint storage

    def validate(self) -> None:
        """Columns must have distinct names (a record is a dict)."""
        if self._df is None:
            return
        columns = list(self._df.columns)
        dupes = sorted({c for c in columns if columns.count(c) > 1})
        if dupes:
            raise PipelineDefinitionError(
                f"source_dataframe: column name(s) {dupes} occur more than once, but a record "
                "is a dict; rename them first (df.toDF(*names) or alias)"
            )

    def prepare(self, job_dir: str, uid: str) -> None:
        """Materialize the DataFrame under ``<job_dir>/inputs/<uid>`` (once per job)."""
        if self._df is None:
            raise LockgateError(
                "DataFrameSource: this copy has no DataFrame (it was pickled); build the "
                "pipeline in the driver"
            )
        folder = fs.join(job_dir, INPUTS_FOLDER, uid)
        materialize_dataframe(self._df, folder)
        self.path = folder

    def create_reader(self, info: TaskInfo) -> SourceReader[dict[str, Any]]:
        """A :class:`DataFrameSourceReader` of the materialized copy."""
        if self.path is None:
            raise LockgateError(
                f"DataFrame source {info.uid!r} was not materialized before the job started; "
                "run the pipeline with Pipeline.run() or Pipeline.start()"
            )
        return DataFrameSourceReader(FileSource(self.path, format="parquet"), info)

    def __getstate__(self) -> dict[str, Any]:
        # The DataFrame lives in the driver's JVM: tasks only need the copy's path.
        return {**self.__dict__, "_df": None}

    def __repr__(self) -> str:
        what = f"table {self.table!r}" if self.table else "DataFrame"
        return f"DataFrameSource({what}, path={fs.redact(self.path) if self.path else None!r})"
