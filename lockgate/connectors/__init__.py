"""Sources and sinks."""

from lockgate.connectors.base import Sink, SinkWriter, Source, SourceReader, TaskInfo
from lockgate.connectors.collect import CollectSink
from lockgate.connectors.dataframe import DataFrameSource
from lockgate.connectors.filesink import FileSink
from lockgate.connectors.filesource import FileSource
from lockgate.connectors.sequence import SequenceSource
from lockgate.connectors.twophase import TwoPhaseCommitSinkWriter

__all__ = [
    "CollectSink",
    "DataFrameSource",
    "FileSink",
    "FileSource",
    "SequenceSource",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceReader",
    "TaskInfo",
    "TwoPhaseCommitSinkWriter",
]
