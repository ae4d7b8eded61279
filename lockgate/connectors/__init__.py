"""Sources and sinks."""

from lockgate.connectors.base import Sink, SinkWriter, Source, SourceReader, TaskInfo
from lockgate.connectors.collect import CollectSink
from lockgate.connectors.dataframe import DataFrameSource
from lockgate.connectors.filesink import FileSink
from lockgate.connectors.filesource import FileSource
from lockgate.connectors.nats import JetStreamSink, JetStreamSource, NatsSink
from lockgate.connectors.push import HttpPushSource, SocketSource
from lockgate.connectors.sequence import SequenceSource
from lockgate.connectors.twophase import TwoPhaseCommitSinkWriter
from lockgate.connectors.writeahead import WriteAheadSinkWriter

__all__ = [
    "CollectSink",
    "DataFrameSource",
    "FileSink",
    "FileSource",
    "HttpPushSource",
    "JetStreamSink",
    "JetStreamSource",
    "NatsSink",
    "SequenceSource",
    "SocketSource",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceReader",
    "TaskInfo",
    "TwoPhaseCommitSinkWriter",
    "WriteAheadSinkWriter",
]
