"""One task: a chain of operators in its own process.

Lifecycle (each step marked in ``Task.run``):

1. listen for input channels, connect to the coordinator, register;
2. open the operators and restore their state from the checkpoint, if any;
3. wait for ``start`` (the addresses of every task of this attempt), connect
   output channels, wait until every input channel is connected;
4. the main loop: records, barriers, end of data, control messages;
5. on ``finish`` (after the final checkpoint) or any error: close everything.

A task needs only its ``TaskSpec``, the coordinator's address and the job
secret; it can start in a subprocess or in a Spark executor alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgpack

from lockgate import fs
from lockgate.api.watermarks import MAX_WATERMARK, MIN_WATERMARK
from lockgate.checkpoint.restore import distribute_operator_state, plan_keyed_restore
from lockgate.checkpoint.storage import (
    ChecksumWriter,
    checkpoint_dir,
    read_state_file,
    write_state_file,
)
from lockgate.connectors.base import TaskInfo
from lockgate.errors import LockgateError, UserFunctionError
from lockgate.graph.jobgraph import JobVertex
from lockgate.runtime import wire
from lockgate.runtime.barriers import AbortReason, BarrierHandler
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.mailbox import CONTROL, Mailbox
from lockgate.runtime.operators import (
    OPERATORS,
    OperatorSnapshot,
    SourceOperator,
    StreamOperator,
)
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.script_classes import register_script_classes
from lockgate.runtime.timers import processing_time
from lockgate.runtime.wire import Frame
from lockgate.state.serde import StateSerializer

log = logging.getLogger("lockgate.task")

LOST = 99  # mailbox kind: an input connection broke


@dataclass
class TaskSpec:
    """Everything a task needs to run, besides the coordinator address and secret.
    Picklable (with cloudpickle, for the user's functions)."""

    job_id: str
    task_id: int
    vertex: JobVertex
    task_index: int
    max_parallelism: int
    attempt: int
    aligned: bool
    job_dir: str
    """The job's checkpoint folder: a local path or a URL every task can reach
    (:mod:`lockgate.fs`); with ``restore_dir``, all a task needs to find state."""
    inputs: list[list[int]]
    """Per input edge, the global numbers of the upstream tasks feeding this task."""
    outputs: list[list[int]]
    """Per output edge, the global numbers of all downstream tasks (by subtask index)."""
    restore_dir: str | None = None
    restore_metadata: dict[str, Any] | None = None
    continues_final: bool = False
    """The restored checkpoint is the final one of an earlier job that ran to its
    end, and this job continues it (an incremental bounded run): every operator
    runs on from its end. Otherwise operators restored as finished are skipped,
    also after a failover to this job's own final checkpoint."""
    allow_pickle: bool = False
    script_classes: list[type] = field(default_factory=list)
    """The classes of the job script the pipeline uses (sent by value): the
    task makes them picklable by name (:mod:`lockgate.runtime.script_classes`)."""
    batch_size: int = 1024
    faults: list[dict[str, Any]] = field(default_factory=list)
    bind_host: str = "127.0.0.1"

    @property
    def name(self) -> str:
        return f"{self.vertex.name} ({self.task_index + 1}/{self.vertex.parallelism})"


class Task:
    def __init__(self, spec: TaskSpec, coordinator: tuple[str, int], secret: bytes) -> None:
        self.spec = spec
        self.coordinator = coordinator
        self.secret = secret
        # classes of the job script: picklable by name here too (records, state)
        register_script_classes(spec.script_classes)
        self.channels = [t for edge in spec.inputs for t in edge]
        self.channel_of = {t: i for i, t in enumerate(self.channels)}
        self.mailbox = Mailbox(len(self.channels))
        self.serializer = StateSerializer(allow_pickle=spec.allow_pickle)
        self.faults = FaultInjector(spec.faults, spec.task_id, spec.attempt)
        self.ops: list[StreamOperator] = []
        self.outputs: list[OutputEdgeWriter] = []
        self.snapshot_pool = ThreadPoolExecutor(1, thread_name_prefix="snapshot")
        self.control: wire.ControlChannel | None = None
        self.ended_channels: set[int] = set()
        self.reached_end = False
        self.drained = False
        """The input ended by ``stop --drain``, not exhausted: a job resumed from
        the final savepoint reads on, so nothing is recorded as finished."""
        self.skipped: set[str] = set()
        """Operators restored as finished (FLIP-147): they read nothing, and
        ``end_input``/``finish`` do not run again."""
        self.watermark: float = MIN_WATERMARK
        """This task's event time: its source's watermark, or the smallest of
        its input channels' (``channel_watermarks``)."""
        self.channel_watermarks = [MIN_WATERMARK] * len(self.channels)
        self.channel_idle = [False] * len(self.channels)
        """Input channels whose upstream declared itself idle (left out of the minimum)."""
        self.idle = False
        """Downstream was told this task is idle (and not yet that it is active again)."""
        self._source_max_watermark: float = MIN_WATERMARK
        """A source's watermark as of the records it read; emitted periodically."""
        self._split_watermarks: dict[Any, float] = {}
        """Per split, the watermark its records allow (readers that set ``last_split``)."""
        self._watermark_due = 0.0
        self._last_read = time.monotonic()
        self.done = False
        self.records_in = 0
        self.records_out = 0
        self._input_sockets: list[socket.socket] = []
        self._inputs_ready = threading.Event()
        self._accept_error: BaseException | None = None

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        try:
            # Step 1. Listen for inputs, connect to the coordinator, register.
            listener = self._listen()
            self._connect_control(listener.getsockname()[1] if listener else 0)
            # Step 2. Open operators and restore their state.
            self._open_operators()
            self._restore()
            # Step 3. Wire the channels of this attempt.
            peers = self._await_start()
            self._connect_outputs(peers)
            if listener is not None:
                threading.Thread(target=self._accept_inputs, args=(listener,),
                                 daemon=True, name="accept").start()
                self._await_inputs()
            # Step 4. Process until finished.
            self.barriers = BarrierHandler(len(self.channels), self, aligned=self.spec.aligned)
            self._send({"t": "running"})
            self._loop()
            # Step 5. End: tell downstream and the coordinator.
            for out in self.outputs:
                out.broadcast(Frame.END_OF_PARTITION, b"", ignore_errors=True)
            self._send({"t": "finished", **self._counts()})
        except BaseException as e:  # report every failure, then die
            self._report_failure(e)
            raise
        finally:
            self._close()

    # ---------------------------------------------------------- set-up steps
    def _listen(self) -> socket.socket | None:
        if not self.channels:
            return None
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((self.spec.bind_host, 0))
        s.listen(len(self.channels) + 8)
        return s

    def _connect_control(self, data_port: int) -> None:
        sock = wire.connect(self.coordinator)
        reader = sock.makefile("rb", buffering=65536)
        wire.authenticate_client(sock, reader, self.secret, {
            "role": "task", "job": self.spec.job_id, "task": self.spec.task_id,
            "attempt": self.spec.attempt,
        })
        self.control = wire.ControlChannel(sock, reader)
        self._send({"t": "register", "host": self.spec.bind_host, "port": data_port,
                    "pid": os.getpid()})
        threading.Thread(target=self._read_control, daemon=True, name="control").start()

    def _read_control(self) -> None:
        assert self.control is not None
        try:
            while True:
                self.mailbox.put_control(self.control.recv())
        except (OSError, EOFError, ValueError):
            self.mailbox.put_control({"t": "lost"})

    def _open_operators(self) -> None:
        spec = self.spec
        if not fs.is_local(spec.job_dir):
            fs.resolve(spec.job_dir)  # load pyarrow.fs and the client now, not at the 1st snapshot
        for op_spec in spec.vertex.operators:
            info = TaskInfo(spec.job_id, op_spec.uid, spec.task_index, spec.vertex.parallelism,
                            spec.max_parallelism, spec.attempt)
            op = OPERATORS[op_spec.kind](op_spec, info)
            op.open(self.serializer)
            self.ops.append(op)
        self.source = self.ops[0] if isinstance(self.ops[0], SourceOperator) else None
        self.chain = self.ops[1:] if self.source else self.ops

    def _restore(self) -> None:
        spec = self.spec
        meta = spec.restore_metadata
        files: dict[str, bytes] = {}

        def data_of(handle: dict[str, Any]) -> bytes:
            if handle["file"] not in files:
                assert spec.restore_dir is not None
                files[handle["file"]] = read_state_file(spec.restore_dir, handle)
            return files[handle["file"]]

        for op in self.ops:
            op_meta = meta["operators"].get(op.uid) if meta else None
            if op_meta is None:
                op.restore_operator_state(None)
                continue
            if op_meta.get("finished") and not (meta.get("final") and spec.continues_final):
                self.skipped.add(op.uid)
            p = spec.vertex.parallelism
            if op.keyed and op.backend is not None:
                plan = plan_keyed_restore(op_meta, spec.task_index, p, spec.max_parallelism)
                for handle, offset, length in plan.blocks:
                    op.backend.restore_block(data_of(handle)[offset:offset + length], plan.states)
            per_subtask: list[list[Any]] = []
            for handle in op_meta["subtasks"]:
                if handle and handle.get("op_state"):
                    off, length = handle["op_state"]
                    per_subtask.append(self.serializer.loads(data_of(handle)[off:off + length]))
                else:
                    per_subtask.append([])
            op.restore_operator_state(distribute_operator_state(
                per_subtask, op_meta["operator_state_mode"], spec.task_index, p))
        files.clear()

    def _await_start(self) -> dict[int, tuple[str, int]]:
        while True:
            item = self.mailbox.take(None)
            assert item is not None
            msg = item[2]
            if msg["t"] == "start":
                return {int(k): (v[0], v[1]) for k, v in msg["peers"].items()}
            if msg["t"] in ("lost", "cancel"):
                raise LockgateError("the coordinator went away before the job started")

    def _connect_outputs(self, peers: dict[int, tuple[str, int]]) -> None:
        spec = self.spec
        hello = {"role": "data", "job": spec.job_id, "attempt": spec.attempt,
                 "from": spec.task_id}
        for edge, targets in zip(spec.vertex.outputs, spec.outputs, strict=True):
            socks: list[socket.socket | None] = []
            for index, target in enumerate(targets):
                if edge.partitioning == "forward" and index != spec.task_index:
                    socks.append(None)
                    continue
                sock = wire.connect(peers[target])
                reader = sock.makefile("rb", buffering=0)
                wire.authenticate_client(sock, reader, self.secret, hello)
                socks.append(sock)
            self.outputs.append(OutputEdgeWriter(edge, socks, spec.task_index,
                                                 spec.max_parallelism, spec.batch_size))

    def _accept_inputs(self, listener: socket.socket) -> None:
        spec = self.spec
        pending = set(self.channels)
        try:
            while pending:
                sock, _ = listener.accept()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader = sock.makefile("rb", buffering=1 << 20)
                hello = wire.authenticate_server(sock, reader, self.secret)
                if hello.get("job") != spec.job_id or hello.get("attempt") != spec.attempt:
                    sock.close()  # a task of another job or an older attempt: fenced off
                    continue
                sender = hello.get("from")
                if sender not in pending:
                    sock.close()
                    continue
                pending.discard(sender)
                self._input_sockets.append(sock)
                ch = self.channel_of[sender]
                threading.Thread(target=self._read_channel, args=(ch, reader),
                                 daemon=True, name=f"in-{ch}").start()
        except BaseException as e:
            self._accept_error = e
        finally:
            listener.close()
            self._inputs_ready.set()

    def _await_inputs(self) -> None:
        while not self._inputs_ready.wait(0.05):
            msg = self.mailbox.take_control()
            if msg and msg["t"] in ("lost", "cancel"):
                raise LockgateError("job cancelled while connecting channels")
        if self._accept_error is not None:
            raise self._accept_error

    def _read_channel(self, ch: int, reader: Any) -> None:
        put = self.mailbox.put
        try:
            while True:
                kind, payload = wire.read_frame(reader)
                if kind == Frame.BATCH:
                    put(ch, kind, wire.decode_batch(payload))
                elif kind in (Frame.BARRIER, Frame.CANCEL_BARRIER, Frame.WATERMARK):
                    put(ch, kind, msgpack.unpackb(payload))
                elif kind == Frame.END_OF_PARTITION:
                    put(ch, kind, None)
                    return
                else:
                    put(ch, kind, payload)
        except (OSError, EOFError) as e:
            put(ch, LOST, str(e))

    # ------------------------------------------------------------ main loop
    def _loop(self) -> None:
        mailbox = self.mailbox
        outputs = self.outputs
        self._timed = [i for i, op in enumerate(self.chain)
                       if op.has_processing_timers and op.uid not in self.skipped]
        timers = self._fire_processing_timers if self._timed else None
        while not self.done:
            wait = timers() if timers is not None else 1.0
            if self.source is not None and not self.reached_end:
                msg = mailbox.take_control()
                if msg is not None:
                    self._on_control(msg)
                    continue
                batch = (None if self.source.uid in self.skipped
                         else self.source.poll(self.spec.batch_size))
                if batch is None:
                    self._end_of_input()
                elif batch:
                    self.records_in += len(batch)
                    self._run_chain(batch, self.chain)
                    if self.source.spec.watermarks is not None:
                        self._source_watermark(batch)
                else:
                    if self.source.spec.watermarks is not None:
                        self._source_watermark(batch)  # periodic emission, idleness
                    self._flush_all()
                    item = mailbox.take(0.01)
                    if item is not None:
                        self._on_element(*item)
                continue
            item = mailbox.take(0)
            if item is None:
                for out in outputs:
                    out.flush()
                item = mailbox.take(wait)  # <= 1 s; wakes up for the next timer
                if item is None:
                    continue
            self._on_element(*item)

    def _fire_processing_timers(self) -> float:
        """Fire the processing-time timers that are due (their output flows
        through the rest of the chain); returns the seconds until the next one.
        Once the input ended, none fires any more (FLIP-147, as in Flink: the
        clock has not reached them, and finish() came first)."""
        if self.reached_end:
            return 1.0
        now = processing_time()
        wait = 1.0
        chain = self.chain
        for i in self._timed:
            op = chain[i]
            due = op.next_processing_timer()
            if due is not None and due <= now:
                fired = op.process_processing_time(now)
                if fired:
                    self._run_chain(fired, chain[i + 1:])
                due = op.next_processing_timer()
            if due is not None:
                wait = min(wait, max(due - now, 0) / 1000)
        return wait

    def _on_element(self, ch: int, kind: int, item: Any) -> None:
        if ch == CONTROL:
            self._on_control(item)
        elif kind == Frame.BATCH:
            self.records_in += len(item)
            self._run_chain(item, self.chain)
        elif kind == Frame.BARRIER:
            if self.spec.aligned and len(self.barriers.live) > 1:
                self.faults.hit("alignment")
            self.barriers.barrier_received(ch, item[0])
        elif kind == Frame.CANCEL_BARRIER:
            self.barriers.cancel_received(ch, item[0])
        elif kind == Frame.END_OF_DATA:
            if msgpack.unpackb(item):
                self.drained = True  # ended by stop --drain upstream
            self.ended_channels.add(ch)
            if len(self.ended_channels) == len(self.channels):
                self._end_of_input()
        elif kind == Frame.WATERMARK:
            if item is None:  # the upstream task is idle
                self.channel_idle[ch] = True
            else:
                self.channel_idle[ch] = False
                self.channel_watermarks[ch] = item
            self._combine_input_watermarks()
        elif kind == Frame.END_OF_PARTITION:
            self.barriers.end_of_partition(ch)
        elif kind == LOST:
            if not self.done:
                up = self.channels[ch]
                raise ConnectionError(f"input channel from task {up} broke: {item}")

    def _run_chain(self, batch: list[Any], ops: list[StreamOperator]) -> None:
        given = batch
        for op in ops:
            try:
                batch = op.process(batch)
            except LockgateError:
                raise
            except Exception as e:
                error = UserFunctionError(f"operator {op.uid!r} raised {type(e).__name__}: {e}")
                error.where = self._input_position(given)
                raise error from e
            if not batch:
                return
        self.faults.hit("batch")
        self.records_out += len(batch)
        for out in self.outputs:
            out.add(batch)

    def _input_position(self, batch: list[Any]) -> str:
        """Where in this task's input ``batch`` was (for a user function's error):
        records are processed a batch at a time, so the batch is named."""
        last = self.records_in
        first = repr(batch[0]) if batch else "-"
        if len(first) > 200:
            first = first[:200] + "..."
        return (f"a batch of {len(batch)} records, input records {last - len(batch) + 1:,}.."
                f"{last:,} of task {self.spec.vertex.name} ({self.spec.task_index + 1}/"
                f"{self.spec.vertex.parallelism}) in attempt {self.spec.attempt}; "
                f"its first record: {first}")

    def _source_watermark(self, batch: list[Any]) -> None:
        """A source task's event time after a poll (``batch``, maybe empty):
        its watermark is emitted when it advanced and the strategy's interval
        is over; with no record for ``idle_timeout`` the task declares itself
        idle, and its next records make it active again."""
        assert self.source is not None
        strategy = self.source.spec.watermarks
        now = time.monotonic()
        if batch:
            self._last_read = now
            try:
                watermark = strategy.watermark_after(batch)
            except Exception as e:
                raise UserFunctionError(
                    f"operator {self.source.uid!r}: the watermark strategy's timestamp_of "
                    f"raised {type(e).__name__}: {e}") from e
            split = self.source.reader.last_split
            if split is None:
                if watermark > self._source_max_watermark:
                    self._source_max_watermark = watermark
            elif watermark > self._split_watermarks.get(split, MIN_WATERMARK):
                self._split_watermarks[split] = watermark
            if self.idle:  # active again: say so now, with the watermark it has
                self._watermark_due = 0.0
        if self._split_watermarks:  # the smallest of the unfinished splits'
            unfinished = self.source.reader.unfinished_splits()
            marks = self._split_watermarks
            watermark = (min(marks.get(s, MIN_WATERMARK) for s in unfinished) if unfinished
                         else max(marks.values()))
            if watermark > self._source_max_watermark:
                self._source_max_watermark = watermark
        going_idle = (not batch and strategy.idle_timeout is not None and not self.idle
                      and now - self._last_read >= strategy.idle_timeout)
        if (now >= self._watermark_due or going_idle) and (
                self._source_max_watermark > self.watermark or self.idle and batch):
            self._watermark_due = now + strategy.interval
            self._advance_watermark(max(self._source_max_watermark, self.watermark))
        if going_idle:  # (after the last watermark it can promise)
            self._declare_idle()

    def _combine_input_watermarks(self) -> None:
        """This task's event time from its inputs': the smallest watermark of
        the channels that are not idle. With every input idle, so is this task."""
        active = [w for w, idle in zip(self.channel_watermarks, self.channel_idle, strict=True)
                  if not idle]
        if not active:
            if not self.idle:
                self._declare_idle()
            return
        combined = min(active)
        if combined > self.watermark or self.idle:
            self._advance_watermark(max(combined, self.watermark))

    def _declare_idle(self) -> None:
        """Tell downstream to leave this task out of their watermarks until it
        sends one again."""
        self.idle = True
        for out in self.outputs:
            out.broadcast(Frame.WATERMARK, msgpack.packb(None))

    def _advance_watermark(self, watermark: float) -> None:
        """Event time advanced: every operator of the chain fires its due
        timers (their output flows through the rest of the chain first), then
        the watermark goes downstream, after those records (also telling them
        this task is active, if it was idle)."""
        self.idle = False
        self.watermark = watermark
        chain = self.chain
        for i, op in enumerate(chain):
            fired = op.process_watermark(watermark)
            if fired:
                self._run_chain(fired, chain[i + 1:])
        if self.outputs:
            payload = msgpack.packb(watermark)
            for out in self.outputs:
                out.broadcast(Frame.WATERMARK, payload)

    def _end_of_input(self) -> None:
        """Bounded input is exhausted (or drained): MAX_WATERMARK (every
        event-time timer fires), then end_input and finish every operator in
        chain order (each one's last output flows through the rest), then
        EndOfData downstream; the coordinator's final checkpoint follows."""
        if self.watermark < MAX_WATERMARK:
            self._advance_watermark(MAX_WATERMARK)
        ops = self.ops
        for i, op in enumerate(ops):
            if op.uid in self.skipped:
                continue  # it finished before the checkpoint this attempt restored
            tail = op.end_input() + op.finish()
            if tail:
                self._run_chain(tail, ops[i + 1:])
        self._flush_all()
        for out in self.outputs:
            out.broadcast(Frame.END_OF_DATA, msgpack.packb(self.drained))
        self.reached_end = True
        self._send({"t": "end_of_data", **self._counts()})
        self.faults.hit("end_of_data")

    def _flush_all(self) -> None:
        for out in self.outputs:
            out.flush()

    # -------------------------------------------------------- control plane
    def _on_control(self, msg: dict[str, Any]) -> None:
        t = msg["t"]
        if t == "trigger":
            self.trigger_snapshot(msg["cp"])
        elif t == "complete":
            self.faults.hit("commit")
            for op in self.ops:
                op.notify_complete(msg["cp"])
        elif t == "abort":
            for op in self.ops:
                op.notify_aborted(msg["cp"])
        elif t == "finish":
            self.faults.hit("finish")
            self.done = True
        elif t == "drain":
            # stop --drain: this source ends its input now, as if exhausted
            # (its position stays in state: a job resumed from the final
            # savepoint reads on from there)
            if self.source is not None and not self.reached_end:
                self.drained = True
                self._end_of_input()
        elif t == "cancel":
            raise LockgateError("cancelled by the driver")
        elif t == "lost":
            raise ConnectionError("lost the connection to the coordinator")

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.control is not None
        self.control.send(msg)

    def _counts(self) -> dict[str, int]:
        """Records this task read from its source and wrote to its sinks."""
        return {"read": self.records_in if self.source is not None else 0,
                "written": sum(getattr(op, "written", 0) for op in self.ops)}

    # ------------------------------------ barrier handler's controller role
    def block(self, channel: int) -> None:
        self.mailbox.blocked.add(channel)

    def unblock_all(self) -> None:
        self.mailbox.unblock_all()

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        self._send({"t": "decline", "cp": checkpoint_id, "reason": reason.value})
        payload = msgpack.packb([checkpoint_id])
        for out in self.outputs:
            out.broadcast(Frame.CANCEL_BARRIER, payload)

    def trigger_snapshot(self, checkpoint_id: int) -> None:
        """Synchronous part: capture every operator's state (sinks pre-commit),
        forward the barrier; the asynchronous part writes the files and acks."""
        snaps = [(op, op.snapshot(checkpoint_id)) for op in self.ops]
        self._flush_all()
        payload = msgpack.packb([checkpoint_id, "checkpoint", time.time()])
        for out in self.outputs:
            out.broadcast(Frame.BARRIER, payload)
        self.snapshot_pool.submit(self._write_snapshot, checkpoint_id, snaps,
                                  {**self._counts(),
                                   "finished": self.reached_end and not self.drained,
                                   "alignment": self.barriers.take_alignment()},
                                  "final_snapshot" if self.reached_end else "snapshot")

    def _write_snapshot(self, checkpoint_id: int,
                        snaps: list[tuple[StreamOperator, OperatorSnapshot]],
                        counts: dict[str, int], fault_point: str) -> None:
        try:
            chk = checkpoint_dir(self.spec.job_dir, checkpoint_id)
            fs.makedirs(chk)
            handles = {op.uid: self._write_state_file(chk, op.uid, snap) for op, snap in snaps}
            self.faults.hit(fault_point)  # before the ack: never races it
            self._send({"t": "ack", "cp": checkpoint_id, "handles": handles, **counts})
            self.faults.hit("acked")
        except Exception as e:  # noqa: BLE001 - any failure declines the checkpoint
            log.exception("snapshot %d failed", checkpoint_id)
            try:
                self._send({"t": "decline", "cp": checkpoint_id,
                            "reason": f"writing the snapshot failed: {type(e).__name__}: {e}",
                            "error_type": type(e).__name__})
            except OSError:
                pass

    def _write_state_file(self, chk: str, uid: str,
                          snap: OperatorSnapshot) -> dict[str, Any] | None:
        """Write one operator's state file (durable: fsynced locally, one
        completed object on an object store) and return its handle."""
        if snap.keyed is None and not snap.operator_state:
            return None
        name = f"{uid}-{self.spec.task_index}.state"
        handle: dict[str, Any] = {"file": name, "keyed_offset": 0}

        def write(out: ChecksumWriter) -> None:
            if snap.keyed is not None:
                handle.update(snap.keyed.write(out))  # type: ignore[arg-type]
            if snap.operator_state:
                blob = self.serializer.dumps(snap.operator_state)
                handle["op_state"] = [out.tell(), len(blob)]
                out.write(blob)

        handle["size"], handle["crc32"] = write_state_file(chk, name, write)
        if "key_groups" in handle:
            handle["key_groups"] = {str(k): v for k, v in handle["key_groups"].items()}
        return handle

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
            self._send({"t": "failed", "error": f"{type(e).__name__}: {e}",
                        "error_type": type(e).__name__,
                        "where": getattr(e, "where", None),
                        "traceback": trace})
        except OSError:
            pass

    def _close(self) -> None:
        self.mailbox.close()
        self.snapshot_pool.shutdown(wait=True)
        for op in self.ops:
            try:
                op.close()
            except Exception:  # noqa: BLE001
                log.exception("closing %s failed", op.uid)
        for out in self.outputs:
            out.close()
        for s in self._input_sockets:
            s.close()
        if self.control is not None:
            self.control.close()


def run_task(spec: TaskSpec, coordinator: tuple[str, int], secret: bytes) -> None:
    """The task entry point of every launcher."""
    with process_name(task_process_name(spec)):
        Task(spec, coordinator, secret).run()


TASK_PROCESS_PREFIX = "lgtask-"


def task_process_name(spec: TaskSpec) -> str:
    """What ``ps -o comm``/``top`` show for a running task: ``lgtask-<attempt>-<task>``
    (Linux keeps 15 characters)."""
    return f"{TASK_PROCESS_PREFIX}{spec.attempt}-{spec.task_id}"[:15]


@contextlib.contextmanager
def process_name(name: str) -> Iterator[None]:
    """Name this process ``name`` while the block runs (Linux ``/proc/self/comm``;
    elsewhere nothing), and give it its old name back after: a Spark Python
    worker runs other tasks afterwards."""
    try:
        with open("/proc/self/comm") as f:
            old = f.read().strip()
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        try:
            with open("/proc/self/comm", "w") as f:
                f.write(old)
        except OSError:
            pass
