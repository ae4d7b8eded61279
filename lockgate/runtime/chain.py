"""The operators of one task, called as plain functions (a chain).

A batch flows through the operators in order and what comes out of the last
goes to the task's output edges. Timers fire between batches: event-time
timers when the task's watermark advances (:meth:`OperatorChain.advance`),
processing-time timers when they are due (:meth:`fire_processing_timers`);
what a timer emits flows through the rest of the chain. A user function's
error names the operator and the input batch it was processing.

Side outputs: an operator whose side output is read is the last of its chain
(``graph/jobgraph.py``), and each such output is an edge of its own
(``OutputEdge.tag``). After every call into an operator, the chain hands
what the last operator emitted to a side output (``StreamOperator.side``) to
the edges of that tag, and drops what other operators emitted to tags nobody
reads. Barriers and watermarks go out on every edge after the records before
them, side outputs included, so every edge stays ordered.
"""

from __future__ import annotations

import time
from typing import Any

from lockgate.errors import LockgateError, UserFunctionError
from lockgate.runtime.coprocess import TwoInputOperator
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.operators import SinkOperator, SourceOperator, StreamOperator
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.spec import TaskSpec
from lockgate.runtime.timers import processing_time
from lockgate.state.backends import KeyedStateBackend


class OperatorChain:
    def __init__(self, spec: TaskSpec, ops: list[StreamOperator], faults: FaultInjector) -> None:
        self.spec = spec
        self.ops = ops
        self.source = ops[0] if isinstance(ops[0], SourceOperator) else None
        self.chain = ops[1:] if self.source else ops
        """The operators a record read (from the source or a channel) goes through."""
        self.faults = faults
        for op in ops:
            if isinstance(op, SinkOperator):
                op.writer.fault = faults.hit  # the sink's own protocol points
            if op.backend is not None:  # the backend's (its restore's, a changelog's)
                op.backend.fault = faults.hit
        self.outputs: list[OutputEdgeWriter] = []
        """The edges of the last operator's main output."""
        self.side_outputs: dict[str, list[OutputEdgeWriter]] = {}
        """The edges of the last operator's side outputs, by tag."""
        self.skipped: set[str] = set()
        """Operators restored as finished (FLIP-147): they read nothing, and
        ``end_input``/``finish`` do not run again."""
        self.records_in = 0
        self.records_out = 0
        self._timed: list[int] = []
        self._preparing: list[KeyedStateBackend] = []

    def start(self, outputs: list[OutputEdgeWriter], skipped: set[str]) -> None:
        self.outputs = [out for out in outputs if out.edge.tag is None]
        self.side_outputs = {}
        for out in outputs:
            if out.edge.tag is not None:
                self.side_outputs.setdefault(out.edge.tag, []).append(out)
        self.skipped = skipped
        self._timed = [i for i, op in enumerate(self.chain)
                       if op.has_processing_timers and op.uid not in skipped]
        self._preparing = [op.backend for op in self.ops
                           if op.backend is not None and op.backend.prepares_snapshots]
        for backend in self._preparing:
            backend.expect_checkpoints(self.spec.checkpoint_interval)

    @property
    def has_processing_timers(self) -> bool:
        return bool(self._timed)

    def process(self, batch: list[Any]) -> None:
        """A batch of this task's input."""
        self.records_in += len(batch)
        self.run(batch, self.chain)

    def process_input(self, index: int, batch: list[Any]) -> None:
        """A batch of input ``index`` of the first operator, one of several
        inputs (:class:`~lockgate.runtime.coprocess.TwoInputOperator`)."""
        self.records_in += len(batch)
        head = self.chain[0]
        assert isinstance(head, TwoInputOperator)
        try:
            out = head.process_input(index, batch)
        except LockgateError:
            raise
        except Exception as e:
            raise self._user_error(head, e, batch) from e
        if head.side:
            self.emit_side(head)
        if out:
            self.run(out, self.chain[1:])

    def run(self, batch: list[Any], ops: list[StreamOperator]) -> None:
        """``batch`` through ``ops`` (the rest of the chain), then out."""
        given = batch
        for op in ops:
            try:
                batch = op.process(batch)
            except LockgateError:
                raise
            except Exception as e:
                raise self._user_error(op, e, given) from e
            if op.side:
                self.emit_side(op)
            if not batch:
                return
        self.faults.hit("batch")
        self.records_out += len(batch)
        for out in self.outputs:
            out.add(batch)

    def _user_error(self, op: StreamOperator, e: Exception,
                    batch: list[Any]) -> UserFunctionError:
        """The error of a user function of ``op`` on ``batch``, with where in
        the task's input it happened (raised ``from`` the function's own)."""
        error = UserFunctionError(f"operator {op.uid!r} raised {type(e).__name__}: {e}")
        error.where = self.input_position(batch)
        return error

    def emit_side(self, op: StreamOperator) -> None:
        """Send what ``op`` emitted to side outputs down their edges (those
        of the chain's last operator; nobody reads another's)."""
        side, op.side = op.side, {}
        if op is not self.ops[-1]:
            return
        for tag, records in side.items():
            for out in self.side_outputs.get(tag, ()):
                out.add(records)

    def input_position(self, batch: list[Any]) -> str:
        """Where in this task's input ``batch`` was (for a user function's error):
        records are processed a batch at a time, so the batch is named."""
        last = self.records_in
        try:
            first = repr(batch[0]) if batch else "-"
        except Exception as e:
            first = f"<{type(batch[0]).__name__}: repr() raised {type(e).__name__}>"
        if len(first) > 200:
            first = first[:200] + "..."
        spec = self.spec
        return (f"a batch of {len(batch)} records, input records {last - len(batch) + 1:,}.."
                f"{last:,} of task {spec.vertex.name} ({spec.task_index + 1}/"
                f"{spec.vertex.parallelism}) in attempt {spec.attempt}; "
                f"its first record: {first}")

    def input_watermark(self, index: int, watermark: float) -> None:
        """Input ``index`` of the first operator (one of several) is at
        ``watermark`` (:attr:`WatermarkValve.input_watermarks`)."""
        head = self.chain[0]
        assert isinstance(head, TwoInputOperator)
        head.input_watermark(index, watermark)

    def advance(self, watermark: float) -> None:
        """Event time advanced: every operator fires its due event-time timers."""
        chain = self.chain
        for i, op in enumerate(chain):
            fired = op.process_watermark(watermark)
            if op.side:
                self.emit_side(op)
            if fired:
                self.run(fired, chain[i + 1:])

    def fire_processing_timers(self) -> float:
        """Fire the processing-time timers that are due; returns the seconds
        until the next one (at most 1)."""
        now = processing_time()
        wait = 1.0
        chain = self.chain
        for i in self._timed:
            op = chain[i]
            due = op.next_processing_timer()
            if due is not None and due <= now:
                fired = op.process_processing_time(now)
                if op.side:
                    self.emit_side(op)
                if fired:
                    self.run(fired, chain[i + 1:])
                due = op.next_processing_timer()
            if due is not None:
                wait = min(wait, max(due - now, 0) / 1000)
        return wait

    @property
    def prepares_snapshots(self) -> bool:
        return bool(self._preparing)

    def prepare_snapshots(self) -> float:
        """Let the state backends get ready for the next checkpoint between
        records (the RocksDB backend's early flush,
        :mod:`lockgate.state.rocksdb.flush`); returns the seconds until one
        wants to be asked again (at most 1)."""
        now = time.monotonic()
        wait = 1.0
        for backend in self._preparing:
            wait = min(wait, backend.prepare_snapshot(now))
        return wait

    def end_input(self) -> None:
        """``end_input`` then ``finish`` every operator in chain order (each
        one's last output flows through the rest), but those restored as finished."""
        ops = self.ops
        for i, op in enumerate(ops):
            if op.uid in self.skipped:
                continue  # it finished before the checkpoint this attempt restored
            tail = op.end_input() + op.finish()
            if op.side:
                self.emit_side(op)
            if tail:
                self.run(tail, ops[i + 1:])

    def written(self) -> int:
        """Records this task's sinks wrote."""
        return sum(op.written for op in self.ops)
