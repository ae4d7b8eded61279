"""Sources and sinks.

Every name below is importable from here (``from lockgate.connectors import
KafkaSource``), but a connector's module is imported on first use of its name,
not with the package: a job pays for the connectors (and their libraries:
pyarrow, numpy, ...) it uses, and so does the local launcher's fork server,
which imports the task code of each job before it forks its tasks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lockgate.connectors.base import Sink, SinkWriter, Source, SourceReader, TaskInfo

if TYPE_CHECKING:
    from lockgate.connectors.cdc import ChangeEvent
    from lockgate.connectors.collect import CollectSink
    from lockgate.connectors.dataframe import DataFrameSource
    from lockgate.connectors.delta import DeltaSink
    from lockgate.connectors.filesink import FileSink
    from lockgate.connectors.filesource import FileSource
    from lockgate.connectors.iceberg import IcebergSink
    from lockgate.connectors.kafka import KafkaRecord, KafkaSink, KafkaSource
    from lockgate.connectors.mysql_cdc import MySqlCdcSource
    from lockgate.connectors.nats import JetStreamSink, JetStreamSource, NatsSink
    from lockgate.connectors.postgres import PostgresSink
    from lockgate.connectors.postgres_cdc import PostgresCdcSource
    from lockgate.connectors.postgres_upsert import PostgresUpsertSink
    from lockgate.connectors.push import HttpPushSource, SocketSource
    from lockgate.connectors.redis_streams import RedisStreamSource, StreamEntry
    from lockgate.connectors.redis_upsert import RedisUpsertSink
    from lockgate.connectors.sequence import SequenceSource
    from lockgate.connectors.twophase import TwoPhaseCommitSinkWriter
    from lockgate.connectors.writeahead import WriteAheadSinkWriter

_LAZY = {
    "ChangeEvent": "cdc",
    "CollectSink": "collect",
    "DataFrameSource": "dataframe",
    "DeltaSink": "delta",
    "FileSink": "filesink",
    "FileSource": "filesource",
    "IcebergSink": "iceberg",
    "KafkaRecord": "kafka",
    "KafkaSink": "kafka",
    "KafkaSource": "kafka",
    "MySqlCdcSource": "mysql_cdc",
    "JetStreamSink": "nats",
    "JetStreamSource": "nats",
    "NatsSink": "nats",
    "PostgresSink": "postgres",
    "PostgresCdcSource": "postgres_cdc",
    "PostgresUpsertSink": "postgres_upsert",
    "HttpPushSource": "push",
    "SocketSource": "push",
    "RedisStreamSource": "redis_streams",
    "StreamEntry": "redis_streams",
    "RedisUpsertSink": "redis_upsert",
    "SequenceSource": "sequence",
    "TwoPhaseCommitSinkWriter": "twophase",
    "WriteAheadSinkWriter": "writeahead",
}
"""Each lazily imported name and the module of this package that defines it."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ChangeEvent",
    "CollectSink",
    "DataFrameSource",
    "DeltaSink",
    "FileSink",
    "FileSource",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSource",
    "HttpPushSource",
    "IcebergSink",
    "JetStreamSink",
    "JetStreamSource",
    "MySqlCdcSource",
    "NatsSink",
    "PostgresCdcSource",
    "PostgresSink",
    "PostgresUpsertSink",
    "RedisStreamSource",
    "RedisUpsertSink",
    "SequenceSource",
    "StreamEntry",
    "SocketSource",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceReader",
    "TaskInfo",
    "TwoPhaseCommitSinkWriter",
    "WriteAheadSinkWriter",
]
