"""Output side of a task: routing batches to the downstream tasks of one edge.

Records are buffered per channel and sent as one pickled batch when a buffer
reaches the batch size, when the task is about to wait, or before any in-band
event (barrier, end of data), so barriers never overtake records. Record
batches of the Arrow path are buffered per channel beside them
(:class:`ArrowOutput`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from operator import call
from typing import Any, cast

from lockgate.config import DEFAULT_BUFFER_TIMEOUT
from lockgate.errors import UnsendableRecordError, UserFunctionError
from lockgate.graph.jobgraph import OutputEdge
from lockgate.protocol import StreamElement
from lockgate.runtime import wire
from lockgate.runtime.wire import Frame
from lockgate.state.keygroups import KeyGroupAssigner

_drain: Callable[[Iterator[Any]], object] = partial(deque, maxlen=0)
"""Runs an iterator to its end, keeping nothing."""


class OutputEdgeWriter:
    def __init__(self, edge: OutputEdge, links: list[wire.Link | None], task_index: int,
                 max_parallelism: int, batch_size: int,
                 buffer_timeout: float = DEFAULT_BUFFER_TIMEOUT) -> None:
        self.edge = edge
        self.links = links
        self.batch_size = batch_size
        self.buffer_timeout = buffer_timeout
        """Seconds a non-empty buffer may wait for more records before it is sent."""
        self.buffers: list[list[Any]] = [[] for _ in links]
        self.partitioning = edge.partitioning
        self.forward_index = task_index if edge.partitioning == "forward" else 0
        self.key_of = edge.key_selector
        self.assigner = KeyGroupAssigner(max_parallelism)
        self.next = task_index % len(links)
        self.last_flush = time.monotonic()
        self.send_time = 0.0
        """Seconds spent sending batches (blocked while downstream is full:
        backpressure; :mod:`lockgate.runtime.metrics`)."""

    def add(self, batch: list[Any]) -> None:
        if not isinstance(cast(Any, batch), list):  # a pyarrow.RecordBatch (runtime/arrow_ops)
            self._add_arrow(batch)
            return
        if self._arrow is not None and self._arrow.pending:
            self._arrow.flush()  # the edge stays in order
        bufs = self.buffers
        if self.partitioning == "hash":
            try:
                keys = list(map(self.key_of, batch))
            except Exception as e:
                raise UserFunctionError(
                    f"the key selector of operator {self.edge.downstream_uid!r} raised "
                    f"{type(e).__name__}: {e}") from e
            targets = self.assigner.route(keys, len(bufs))
            # one C-speed pass whatever the number of channels: each record
            # appended to its target's buffer
            appends = [b.append for b in bufs]
            _drain(map(call, map(appends.__getitem__, targets), batch))
        elif self.partitioning == "forward":
            bufs[self.forward_index].extend(batch)
        elif self.partitioning == "broadcast":  # every record to every task
            for b in bufs:
                b.extend(batch)
        else:  # rebalance: whole batches round-robin
            bufs[self.next].extend(batch)
            self.next = (self.next + 1) % len(bufs)
        size = self.batch_size
        for i, b in enumerate(bufs):
            if len(b) >= size:
                self._send(i)
        if time.monotonic() - self.last_flush >= self.buffer_timeout:
            self.flush()

    def _send(self, i: int) -> None:
        records = self.buffers[i]
        self.buffers[i] = []
        link = self.links[i]
        assert link is not None
        try:
            payload = wire.encode_batch(records)
        except Exception as e:
            raise self._unsendable(records, i, e) from e
        started = time.perf_counter()
        link.send(Frame.BATCH, payload)
        self.send_time += time.perf_counter() - started

    def _unsendable(self, records: list[Any], i: int, error: Exception) -> UserFunctionError:
        """The error of a batch that cannot be pickled: it names the operator
        that emitted it, pickle's reason and the first record that fails.
        Fatal (:class:`~lockgate.errors.UnsendableRecordError`): the replay
        emits the same record again, so a restart cannot help."""
        edge = self.edge
        failed = UnsendableRecordError(
            f"operator {edge.upstream_uid!r} emitted a record that cannot be sent to the "
            f"next task: {type(error).__name__}: {error}")
        culprit = next(((n, r) for n, r in enumerate(records) if not _picklable(r)), None)
        to = (f"operator {edge.downstream_uid!r} (task {i + 1}/"
              f"{edge.downstream_parallelism})")
        if culprit is None:
            failed.where = f"a batch of {len(records)} records on its way to {to}"
        else:
            n, record = culprit
            try:
                shown = repr(record)
            except Exception:
                shown = f"<a {type(record).__name__} whose repr() raised>"
            if len(shown) > 200:
                shown = shown[:200] + "..."
            failed.where = (f"record {n + 1} of a batch of {len(records)} on its way to "
                            f"{to}: {shown}")
        return failed

    _arrow: Any = None
    """The buffers of record batches (:class:`ArrowOutput`), from the first one on."""

    def _add_arrow(self, batch: Any) -> None:
        if self._arrow is None:
            self._arrow = ArrowOutput(self)
        if any(self.buffers):
            self.flush()  # the edge stays in order
        self._arrow.add(batch)

    def flush(self) -> None:
        if self._arrow is not None:
            self._arrow.flush()
        for i, b in enumerate(self.buffers):
            if b:
                self._send(i)
        self.last_flush = time.monotonic()

    def broadcast(self, element: StreamElement, ignore_errors: bool = False) -> None:
        """Send an in-band element on every channel, after the buffered records."""
        kind, payload = wire.element_frame(element)
        try:
            self.flush()
            for link in self.links:
                if link is not None:
                    link.send(kind, payload)
        except OSError:
            if not ignore_errors:
                raise

    def unsent(self) -> list[tuple[int, bool, list[Any]]]:
        """What is buffered per channel and not yet sent, as ``(channel,
        arrow, records or record batches)``: an unaligned checkpoint's output
        channel state (sent after its barrier, as usual)."""
        out = [(i, False, list(b)) for i, b in enumerate(self.buffers) if b]
        if self._arrow is not None:
            out += [(i, True, list(b)) for i, b in enumerate(self._arrow.buffers) if b]
        return out

    def send_ahead(self, element: StreamElement) -> None:
        """Send an in-band element on every channel ahead of the buffered
        records (an unaligned checkpoint's barrier)."""
        kind, payload = wire.element_frame(element)
        for link in self.links:
            if link is not None:
                link.send(kind, payload)

    def resend(self, i: int, kind: Frame, payload: bytes) -> None:
        """Send a frame of recovered output channel state to channel ``i``
        (on restore, before anything else)."""
        link = self.links[i]
        if link is None:
            raise ValueError(f"channel {i} of the edge to {self.edge.downstream_uid!r} "
                             "is not connected from this task")
        link.send(kind, payload)

    def close(self) -> None:
        for link in self.links:
            if link is not None:
                try:
                    link.close()
                except OSError:
                    pass


def _picklable(record: Any) -> bool:
    try:
        wire.encode_batch([record])
    except Exception:
        return False
    return True


class ArrowOutput:
    """The Arrow side of one :class:`OutputEdgeWriter`: record batches
    buffered per channel (a buffer is sent as one IPC frame once it holds
    ``batch_size`` rows, before any in-band event, or when the schema
    changes)."""

    def __init__(self, writer: OutputEdgeWriter) -> None:
        from lockgate.api.arrow import ColumnKey
        from lockgate.runtime.arrow_ops import KeyRouter

        self.writer = writer
        n = len(writer.links)
        self.buffers: list[list[Any]] = [[] for _ in range(n)]
        self.rows = [0] * n
        self.router: KeyRouter | None = None
        if writer.partitioning == "hash":
            key = writer.key_of
            if not isinstance(key, ColumnKey):
                raise UserFunctionError(
                    f"operator {writer.edge.downstream_uid!r} is keyed by a function, but its "
                    "input is a stream of Arrow batches: use key_by_column, or to_rows() first")
            self.router = KeyRouter(writer.assigner.max_parallelism, n)

    @property
    def pending(self) -> bool:
        return any(self.rows)

    def add(self, batch: Any) -> None:
        from lockgate.runtime.arrow_ops import split_by_target

        w = self.writer
        n = len(self.buffers)
        if self.router is not None:
            column = w.key_of.column
            try:
                keys = batch.column(column)
            except KeyError:
                raise UserFunctionError(
                    f"the key column {column!r} of operator {w.edge.downstream_uid!r} is not in "
                    f"the batch (columns: {batch.schema.names})") from None
            for i, rows in split_by_target(batch, self.router.targets(keys), n):
                self._put(i, rows)
        elif w.partitioning == "forward":
            self._put(w.forward_index, batch)
        elif w.partitioning == "broadcast":
            for i in range(n):
                self._put(i, batch)
        else:  # rebalance: whole batches round-robin
            self._put(w.next, batch)
            w.next = (w.next + 1) % n
        if time.monotonic() - w.last_flush >= w.buffer_timeout:
            w.flush()

    def _put(self, i: int, batch: Any) -> None:
        buf = self.buffers[i]
        if buf and not buf[0].schema.equals(batch.schema):
            self.send(i)
            buf = self.buffers[i]
        buf.append(batch)
        self.rows[i] += len(batch)
        if self.rows[i] >= self.writer.batch_size:
            self.send(i)

    def send(self, i: int) -> None:
        from lockgate.runtime.arrow_wire import encode_arrow
        from lockgate.runtime.wire import Frame

        batches, self.buffers[i], self.rows[i] = self.buffers[i], [], 0
        link = self.writer.links[i]
        assert link is not None
        payload = encode_arrow(batches)
        started = time.perf_counter()
        link.send(Frame.ARROW_BATCH, payload)
        self.writer.send_time += time.perf_counter() - started  # blocked: backpressure

    def flush(self) -> None:
        for i, rows in enumerate(self.rows):
            if rows:
                self.send(i)
