"""Sources and sinks."""

from lockgate.connectors.base import Sink, SinkWriter, Source, SourceReader, TaskInfo
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
