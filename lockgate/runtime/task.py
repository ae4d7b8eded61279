"""One task: a chain of operators in its own process.

Lifecycle (each step marked in ``Task.run``):

1. listen for input channels, connect to the coordinator, :class:`Register`;
2. open the operators and restore their state from the checkpoint, if any
   (:mod:`lockgate.runtime.snapshots`);
3. wait for :class:`Start` (the addresses of every task of this attempt),
   connect output channels, wait until every input channel is connected
   (:mod:`lockgate.runtime.channels`);
4. the main loop: stream elements from the mailbox, control messages
   (:mod:`lockgate.runtime.task_control`), the source's polls and
   processing-time timers, one ``match`` each;
5. on :class:`Finish` (after the final checkpoint) or any error: close everything.

Alongside the loop, collaborators with one concern each: barrier alignment
is a ``BarrierHandler`` (pure; the mailbox is its input gate), the task's
side of a checkpoint a ``Snapshotter`` (the handler's controller), the
coordinator's messages a ``ControlHandler``, event time a
``WatermarkValve``, and snapshots are written by a ``SnapshotWriter``
thread. A task needs only its ``TaskSpec``, the coordinator's address and
the job secret; it can start in a subprocess or in a Spark executor alike.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from lockgate import fs
from lockgate.api.watermarks import MAX_WATERMARK
from lockgate.connectors.base import TaskInfo
from lockgate.errors import LockgateError, UserFunctionError
from lockgate.protocol import (
    END_OF_PARTITION,
    Barrier,
    Batch,
    Cancel,
    CancelBarrier,
    ChannelLost,
    ControlLost,
    ControlMessage,
    EndOfData,
    EndOfPartition,
    Failed,
    Finished,
    Hello,
    Idle,
    InputEnded,
    Register,
    Running,
    Start,
    StreamElement,
    Watermark,
)
from lockgate.redact import redact
from lockgate.runtime import channel_state, channels, handshake, wire
from lockgate.runtime.barriers import BarrierHandler
from lockgate.runtime.chain import OperatorChain
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.mailbox import CONTROL, OVERTAKABLE, Mailbox, Overtaking
from lockgate.runtime.metrics import TaskMeter
from lockgate.runtime.operators import SourceOperator, StreamOperator
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.registry import operator_class
from lockgate.runtime.snapshots import SnapshotWriter, restore_operators
from lockgate.runtime.snapshotter import Progress, Snapshotter
from lockgate.runtime.spec import TaskSpec, process_name, task_process_name
from lockgate.runtime.steps import Steps, mark
from lockgate.runtime.task_control import ControlHandler, Next
from lockgate.runtime.valve import Emitted, WatermarkValve
from lockgate.state.backends import close_backend
from lockgate.state.rocksdb.recovery import LocalRestore
from lockgate.state.script_classes import register_script_classes
from lockgate.state.serde import StateSerializer

log = logging.getLogger("lockgate.task")

ORPHAN_GRACE = 3.0
"""Seconds a task that lost its control connection (its driver is gone) has
to end by itself before it exits on the spot, wherever its main thread is
(e.g. blocked restoring state): no task outlives its driver."""


class Task:
    def __init__(self, spec: TaskSpec, coordinator: tuple[str, int], secret: bytes,
                 before_finished: Callable[[], None] | None = None,
                 steps: Steps | None = None) -> None:
        self.spec = spec
        self.steps: Steps = dict(steps or {})
        """When each start-up step happened (:mod:`lockgate.runtime.steps`)."""
        self.coordinator = coordinator
        self.secret = secret
        self.before_finished = before_finished
        """Called just before the task says :class:`Finished` (the Spark
        launcher's lease: from then on the task ends by itself)."""
        # classes of the job script: picklable by name here too (records, state)
        register_script_classes(spec.script_classes)
        self.channels = [t for edge in spec.inputs for t in edge]
        index = [e.input_index for e, ts in zip(spec.vertex.inputs, spec.inputs, strict=True)
                 for _ in ts]
        self.input_of: list[int] | None = index if any(index) else None
        """Multi-input operators (``connect``, joins): the input of each channel."""
        # unaligned: barriers overtake the queue, so it may hold more
        self.mailbox = Mailbox(len(self.channels), 8 if spec.unaligned else 4)
        self.serializer = StateSerializer(allow_pickle=spec.allow_pickle)
        self.faults = FaultInjector(spec.faults, spec.task_id, spec.attempt)
        self.ops: list[StreamOperator] = []
        self.outputs: list[OutputEdgeWriter] = []
        self.inputs = channels.InputChannels(
            spec, secret, {t: i for i, t in enumerate(self.channels)}, self.mailbox)
        self.snapshots = SnapshotWriter(spec, self.serializer, self.faults, self._send)
        self.control: wire.ControlChannel | None = None
        self._closing = False
        """Set when the task ends: its control connection closes by its own hand."""
        self.ended_channels: set[int] = set()
        self.reached_end = False
        self.drained = False
        """The input ended by ``stop --drain``, not exhausted: a job resumed from
        the final savepoint reads on, so nothing is recorded as finished."""
        watermarks = spec.vertex.operators[0].watermarks  # a source's strategy, or None
        self.valve = WatermarkValve(
            len(self.channels), watermarks.interval if watermarks else 0.0,
            watermarks.idle_timeout if watermarks else None, now=time.monotonic(),
            input_of=self.input_of)
        self.done = False
        self.replaying: dict[int, int] = {}
        """Recovered in-flight elements still queued, per input channel."""
        self.meter = TaskMeter()
        """Busy, idle and backpressured time; reports the task's figures."""
        self.local_restores: list[list[Any]] = []
        """Per keyed operator that looked for a local copy of its state when
        it restored (local recovery): ``[uid, checkpoint, used, reason]``."""

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        try:
            # Step 1. Listen for inputs, connect to the coordinator, register.
            listener = channels.listen(self.spec, len(self.channels))
            self._connect_control(listener.getsockname()[1] if listener else 0)
            mark(self.steps, "connected")
            # Step 2. Open operators and restore their state.
            self._open_operators()
            self.faults.hit("restore")
            local: list[tuple[str, LocalRestore]] = []
            skipped = restore_operators(self.spec, self.ops, self.serializer, local)
            self.local_restores = [[uid[:1000], n.checkpoint_id, n.local, n.reason[:1000]]
                                   for uid, n in local]
            recovered = channel_state.recover(self.spec, self.serializer)
            mark(self.steps, "restored")
            # Step 3. Wire the channels of this attempt.
            peers = self._await_start()
            mark(self.steps, "started")
            self.outputs = channels.connect_outputs(self.spec, peers, self.secret)
            if recovered is not None:  # in-flight data first: before any new output
                recovered.resend(self.outputs, self.faults)
                self.replaying = recovered.preload(self.mailbox)
            mark(self.steps, "outputs")
            self.chain.start(self.outputs, skipped)
            if listener is not None:
                self.inputs.accept(listener)
                self._await_inputs()
            mark(self.steps, "inputs")
            # Step 4. Process until finished.
            self.snapshotter = Snapshotter(
                self.ops, self.outputs, self.snapshots, self.serializer, self.faults, self._send,
                self._progress,
                unaligned_at_source=self.spec.unaligned and not self.spec.aligned_timeout)
            self.control_handler = ControlHandler(self.snapshotter, self.faults)
            self.barriers = BarrierHandler(len(self.channels), self.snapshotter, self.mailbox,
                                           aligned=self.spec.aligned,
                                           unaligned=self.spec.unaligned,
                                           aligned_timeout=self.spec.aligned_timeout)
            if self.spec.unaligned:
                self.mailbox.let_overtake(self.barriers.overtakes)
            mark(self.steps, "running")
            self._send(Running(self.steps, self.local_restores))
            self.meter.start(self, self._send)
            collect_less()
            sys.setswitchinterval(SWITCH_INTERVAL)
            self._loop()
            # Step 5. End: tell downstream and the coordinator.
            for out in self.outputs:
                out.broadcast(END_OF_PARTITION, ignore_errors=True)
            if self.before_finished is not None:
                self.before_finished()
            # the state's local files go before the coordinator hears of the
            # end: once every task finished, the job's processes may be ended
            self._close_operators()
            self._send(Finished(*self._counts()))
        except BaseException as e:  # report every failure, then die
            self._report_failure(e)
            raise
        finally:
            self._close()

    # ---------------------------------------------------------- set-up steps
    def _connect_control(self, data_port: int) -> None:
        spec = self.spec
        self.control = wire.ControlChannel(handshake.open_link(
            self.coordinator, self.secret, Hello("task", spec.job_id, spec.attempt, spec.task_id),
            encrypt=spec.encrypt_traffic, buffering=65536))
        threading.Thread(target=self._read_control, daemon=True, name="control").start()
        self.faults.hit("register")
        self._send(Register(spec.bind_host, data_port, os.getpid()))

    def _read_control(self) -> None:
        assert self.control is not None
        try:
            while True:
                self.mailbox.put_control(self.control.recv())
        except Exception as e:
            if not isinstance(e, OSError | EOFError | ValueError):
                log.error("the control channel failed: %s: %s", type(e).__name__, e)
            self.mailbox.put_control(ControlLost())
        if not self._closing:
            threading.Thread(target=_exit_orphan, daemon=True, name="orphan-watchdog").start()

    def _open_operators(self) -> None:
        spec = self.spec
        if not fs.is_local(spec.job_dir):
            fs.resolve(spec.job_dir)  # load pyarrow.fs and the client now, not at the 1st snapshot
        for op_spec in spec.vertex.operators:
            info = TaskInfo(spec.job_id, op_spec.uid, spec.task_index, spec.vertex.parallelism,
                            spec.max_parallelism, spec.attempt)
            op = operator_class(op_spec.kind)(op_spec, info)
            op.setup(spec.state_backend, spec.job_dir, self.mailbox.wake)
            op.open(self.serializer)
            self.ops.append(op)
        self.chain = OperatorChain(spec, self.ops, self.faults)
        self.source = self.chain.source

    def _await_start(self) -> dict[int, tuple[str, int]]:
        while True:
            item = self.mailbox.take(None)
            assert item is not None
            match item[1]:
                case Start(peers):
                    return peers
                case ControlLost() | Cancel():
                    raise LockgateError("the coordinator went away before the job started")

    def _await_inputs(self) -> None:
        while not self.inputs.ready.wait(0.05):
            if isinstance(self.mailbox.take_control(), ControlLost | Cancel):
                raise LockgateError("job cancelled while connecting channels")
        if self.inputs.error is not None:
            raise self.inputs.error

    # ------------------------------------------------------------ main loop
    def _loop(self) -> None:
        mailbox = self.mailbox
        outputs = self.outputs
        timers = self.chain.has_processing_timers
        prepare = self.chain.prepares_snapshots
        snapshotter = self.snapshotter
        while not self.done:
            if snapshotter.holding is not None:  # a stop's savepoint, a rescale's: control only
                msg = mailbox.wait_control(1.0)
                if msg is not None:
                    self._on_control(msg)
                continue
            # Once the input ended, no processing-time timer fires any more
            # (FLIP-147, as in Flink: the clock has not reached them, and
            # finish() came first).
            wait = (self.chain.fire_processing_timers() if timers and not self.reached_end
                    else 1.0)
            if prepare:  # between records: a RocksDB backend's early flush
                wait = min(wait, self.chain.prepare_snapshots())
            if self.spec.aligned_timeout:
                wait = self.barriers.tick(wait)
            if self.source is not None and not self.reached_end:
                msg = mailbox.take_control()
                if msg is not None:
                    self._on_control(msg)
                    continue
                self._poll_source(self.source)
                continue
            item = mailbox.take(0)
            if item is None:
                for out in outputs:
                    out.flush()
                item = self.meter.wait(mailbox, wait)  # <= 1 s; wakes up for the next timer
                if item is None:
                    continue
            self._on_item(*item)

    def _poll_source(self, source: SourceOperator) -> None:
        batch = None if source.uid in self.chain.skipped else source.poll(self.spec.batch_size)
        if batch is None:
            self._end_of_input()
            return
        if batch:
            self.chain.process(batch)
        if source.spec.watermarks is not None:
            self._source_watermark(source, batch)  # also periodic emission, idleness
        if not batch:
            self._flush_all()
            item = self.meter.wait(self.mailbox, 0.01)
            if item is not None:
                self._on_item(*item)

    def _on_item(self, ch: int, item: StreamElement | ControlMessage | Overtaking) -> None:
        if ch == CONTROL:
            assert isinstance(item, ControlMessage)
            self._on_control(item)
            return
        if self.barriers.recording and ch in self.barriers.recording:
            self.snapshotter.record_input(ch, [item])  # type: ignore[list-item] # before its barrier
        if self.replaying and ch in self.replaying and type(item) in OVERTAKABLE:
            self._replayed(ch)
        match item:
            case Batch(records):
                if self.input_of is None:
                    self.chain.process(records)
                else:
                    self.chain.process_input(self.input_of[ch], records)
            case Barrier():
                if self.spec.aligned and len(self.barriers.live) > 1:
                    self.faults.hit("alignment")
                self.barriers.barrier_received(ch, item)
            case Overtaking(barrier, overtaken):  # unaligned: ahead of queued batches
                self.barriers.barrier_received(ch, barrier, overtaken)
            case CancelBarrier(checkpoint_id):
                self.barriers.cancel_received(ch, checkpoint_id)
            case EndOfData(drained):
                if drained:
                    self.drained = True  # ended by stop --drain upstream
                self.ended_channels.add(ch)
                if len(self.ended_channels) == len(self.channels):
                    self._end_of_input()
            case Watermark(timestamp):
                self._input_event(ch, self.valve.input_watermark(ch, timestamp))
            case Idle():
                self._input_event(ch, self.valve.input_idle(ch))
            case EndOfPartition():
                self.barriers.end_of_partition(ch)
            case ChannelLost(reason):
                if not self.done:
                    raise ConnectionError(
                        f"input channel from task {self.channels[ch]} broke: {reason}")

    def _on_control(self, msg: ControlMessage) -> None:
        match self.control_handler.handle(msg):
            case Next.FINISH:
                self.done = True
            case Next.DRAIN:
                if self.source is not None and not self.reached_end:
                    self.drained = True
                    self._end_of_input()

    def _send(self, msg: ControlMessage) -> None:
        assert self.control is not None
        self.control.send(msg)

    def _counts(self) -> tuple[int, int]:
        """Records this task read from its source and wrote to its sinks."""
        return (self.chain.records_in if self.source is not None else 0,
                self.chain.written())

    # ------------------------------------------------------------ event time
    def _source_watermark(self, source: SourceOperator, batch: list[Any]) -> None:
        """A source task's event time after a poll (``batch``, maybe empty)."""
        strategy = source.spec.watermarks
        assert strategy is not None
        mark = None
        if batch:
            try:
                mark = strategy.watermark_after(batch)
            except Exception as e:
                raise UserFunctionError(
                    f"operator {source.uid!r}: the watermark strategy's timestamp_of "
                    f"raised {type(e).__name__}: {e}") from e
        reader = source.reader
        self._apply(self.valve.source_polled(time.monotonic(), mark, reader.last_split,
                                             reader.unfinished_splits))

    def _input_event(self, ch: int, emitted: Emitted) -> None:
        """A watermark or idleness came on channel ``ch``: an operator of
        several inputs first gets that input's own watermark, then the task
        does what the valve decided."""
        if self.input_of is not None:
            index = self.input_of[ch]
            self.chain.input_watermark(index, self.valve.input_watermarks[index])
        self._apply(emitted)

    def _apply(self, emitted: Emitted) -> None:
        """Do what the valve decided. A watermark: every operator of the chain
        fires its due timers (their output flows through the rest of the chain
        first), then the watermark goes downstream, after those records. Idle:
        downstream leaves this task out of their watermarks until its next."""
        for element in emitted:
            if isinstance(element, Watermark):
                self.chain.advance(element.timestamp)
            for out in self.outputs:
                out.broadcast(element)

    def _end_of_input(self) -> None:
        """Bounded input is exhausted (or drained): MAX_WATERMARK (every
        event-time timer fires), then end_input and finish every operator in
        chain order (each one's last output flows through the rest), then
        EndOfData downstream; the coordinator's final checkpoint follows."""
        if self.valve.watermark < MAX_WATERMARK:
            self._apply(self.valve.advance(MAX_WATERMARK))
        self.chain.end_input()
        self._flush_all()
        for out in self.outputs:
            out.broadcast(EndOfData(self.drained))
        self.reached_end = True
        self._send(InputEnded(*self._counts()))
        self.faults.hit("end_of_data")

    def _flush_all(self) -> None:
        for out in self.outputs:
            out.flush()

    def _replayed(self, ch: int) -> None:
        """A recovered in-flight element of ``ch`` is taken."""
        self.faults.hit("replay")
        left = self.replaying[ch] - 1
        if left:
            self.replaying[ch] = left
        else:
            del self.replaying[ch]

    def _progress(self) -> Progress:
        """The task's counts and end of input, for a snapshot."""
        read, written = self._counts()
        return Progress(read, written, self.reached_end and not self.drained, self.reached_end)

    # ---------------------------------------------------------------- end
    def _report_failure(self, e: BaseException) -> None:
        if self.control is None:
            return
        try:
            # a user function's error: its own traceback (the user's frames),
            # not the runtime's that wrapped it
            cause = e.__cause__ if isinstance(e, UserFunctionError) else None
            trace = ("".join(traceback.format_exception(cause)) if cause is not None
                     else traceback.format_exc())
            origin = e.__cause__
            # a connector's error may quote its settings: no secret leaves the task
            self._send(Failed(redact(f"{type(e).__name__}: {e}"), type(e).__name__,
                              e.where if isinstance(e, UserFunctionError) else None,
                              redact(trace),
                              type(origin).__name__ if origin is not None else None))
        except OSError:
            pass

    def _close_operators(self) -> None:
        """Close every operator and its state backend, once (the snapshot
        writer first: it may still read a backend)."""
        self.snapshots.close()
        ops, self.ops = self.ops, []
        for op in ops:
            try:
                op.close()
                close_backend(op.backend)
            except Exception:
                log.exception("closing %s failed", op.uid)

    def _close(self) -> None:
        self._closing = True
        self.meter.stop()
        self.mailbox.close()
        self._close_operators()
        for out in self.outputs:
            out.close()
        self.inputs.close()
        if self.control is not None:
            self.control.close()


def _exit_orphan() -> None:
    """The control connection was lost: the main thread notices it at its next
    look at the mailbox; if it has not ended :data:`ORPHAN_GRACE` seconds
    later (it is blocked elsewhere), the process ends here."""
    time.sleep(ORPHAN_GRACE)
    log.warning("lost the driver %.0f s ago and still running: exiting", ORPHAN_GRACE)
    logging.shutdown()
    os._exit(1)


SWITCH_INTERVAL = 0.0005
"""Seconds a thread of a running task may hold the GIL while another waits
for it (Python's default: 0.005). The main thread runs records; the
readers of the input channels, the snapshot thread and the control
connection release the GIL at every socket or file call and must win it
back each time: at 5 ms a wait, a snapshot's few dozen file calls took
hundreds of milliseconds while the main thread was busy, and a reader
handed over few batches a second."""

GC_THRESHOLD = 20_000
"""Allocations (less deallocations) of container objects between two
collections of the youngest generation while a task runs (Python's default:
700)."""


def collect_less() -> None:
    """Tune the cyclic garbage collector for the record loop: every object
    of the start-up (modules, operators, restored state) is frozen, so a
    full collection no longer walks them all, and the youngest generation is
    collected after ``GC_THRESHOLD`` allocations instead of 700: a batch of
    records allocates thousands of tuples that reference counting frees, and
    the default threshold collected several times per batch. Records are
    acyclic as a rule; a cycle waits a little longer to be collected."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, middle, old)


def run_task(spec: TaskSpec, coordinator: tuple[str, int], secret: bytes,
             before_finished: Callable[[], None] | None = None,
             steps: Steps | None = None) -> None:
    """The task entry point of every launcher (``steps``: those the launcher's
    code marked before, :mod:`lockgate.runtime.steps`)."""
    with process_name(task_process_name(spec)):
        Task(spec, coordinator, secret, before_finished, steps).run()
