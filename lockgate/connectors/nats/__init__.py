"""NATS connectors: ``JetStreamSource`` (replayable), ``JetStreamSink``
(exactly-once, write-ahead with ``Nats-Msg-Id`` de-duplication) and
``NatsSink`` (core NATS, at-least-once). Importing this package does not
import ``nats-py``: the tasks and the driver's checks do, on first use."""

from lockgate.connectors.nats.sinks import JetStreamSink, NatsSink
from lockgate.connectors.nats.source import JetStreamMessage, JetStreamSource

__all__ = ["JetStreamMessage", "JetStreamSink", "JetStreamSource", "NatsSink"]
