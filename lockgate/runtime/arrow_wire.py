"""Record batches on a data channel: one Arrow IPC stream per frame.

A frame of type ``Frame.ARROW_BATCH`` (``runtime/wire.py``) carries the
batches buffered for one channel as an Arrow IPC *stream* (schema, then the
batches): the columns' buffers as they are, no pickle, no per-row work. The
frame is authenticated like every other (its tag verified before this module
reads a byte of it); what it decodes is still checked: a payload that is not
one IPC stream of valid batches is a :class:`ProtocolError`.
"""

from __future__ import annotations

from typing import Any

from lockgate.protocol import ProtocolError

__all__ = ["decode_arrow", "encode_arrow"]


def encode_arrow(batches: list[Any]) -> bytes:
    """One IPC stream of ``batches`` (all of one schema)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def decode_arrow(payload: bytes) -> Any:
    """The record batch of a frame (several in the stream are concatenated,
    zero rows give an empty batch of the stream's schema); the batch's
    buffers point into ``payload`` (no copy)."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        batches = list(reader)
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=reader.schema)
        batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        batch.validate()
    except Exception as e:
        raise ProtocolError(f"undecodable Arrow batch frame: {type(e).__name__}: {e}") from None
    return batch
