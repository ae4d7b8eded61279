"""Operators as they run inside a task: each turns a batch into a batch.

A chain is a list of operators called one after the other on whole batches;
the per-record cost is the user's function plus a list comprehension step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from lockgate.api.functions import KeyedProcessFunction, OutputTag, RuntimeContext
from lockgate.api.watermarks import TimeDomain, TimerService
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import SinkWriter, SourceReader, TaskInfo
from lockgate.errors import LockgateError, PipelineDefinitionError, UserFunctionError
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.runtime.timers import KeyedTimers
from lockgate.state.backend import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from lockgate.state.backends import BackendScope, KeyedSnapshot, KeyedStateBackend, StateBackend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.keygroups import key_group_range
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl import TtlStates
from lockgate.state.values import ATOMIC, immutable, private_copy


@dataclass
class OperatorSnapshot:
    """The synchronous part of one operator's snapshot; written asynchronously."""

    keyed: KeyedSnapshot | None = None
    operator_state: list[Any] = field(default_factory=list)


class StreamOperator:
    """Base of the runtime operators. ``process`` maps a batch to a batch.

    What an operator emits to side outputs (``emit_side``) waits in ``side``
    (tag name -> records) until the chain takes it, after every call that may
    emit: ``process``, ``process_watermark``, ``process_processing_time``,
    ``end_input``, ``finish``."""

    keyed = False
    operator_state_mode = OperatorStateMode.SPLIT  # how entries are redistributed
    has_processing_timers = False
    written = 0
    """Records this operator wrote to a sink (a sink's)."""

    def __init__(self, spec: OperatorSpec, info: TaskInfo) -> None:
        self.spec = spec
        self.uid = spec.uid
        self.info = info
        self.backend: KeyedStateBackend | None = None
        self.side: dict[str, list[Any]] = {}
        self.state_backend: StateBackend | None = None
        """The job's keyed state backend (None: heap)."""
        self.job_dir = ""
        self.wake: Callable[[], None] | None = None
        """Wakes the task's loop from its wait for input (any thread): an
        operator whose timer became due because of another thread (an async
        result) calls it; None outside a task."""

    def setup(self, state_backend: StateBackend | None, job_dir: str,
              wake: Callable[[], None] | None = None) -> None:
        """What the task gives its operators before ``open`` (Flink's
        ``setup``): the job's keyed state backend (None: heap), its
        checkpoint folder (``job_dir``) and ``wake``."""
        self.state_backend, self.job_dir, self.wake = state_backend, job_dir, wake

    def emit_side(self, tag: str, value: Any) -> None:
        """Emit ``value`` to the side output named ``tag``."""
        records = self.side.get(tag)
        if records is None:
            self.side[tag] = [value]
        else:
            records.append(value)

    def open(self, serializer: StateSerializer) -> None:
        pass

    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        """``entries`` this task received from the checkpoint; ``None`` on a
        fresh start. ``committed``: the restored savepoint's output was all
        committed (its job ended after the commits): a sink's write-ahead
        writer does not send it again (its de-duplication ids may be out of
        the target's window by now). Other operators ignore it."""

    def process(self, batch: list[Any]) -> list[Any]:
        raise NotImplementedError

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        """The synchronous part of checkpoint ``checkpoint_id``'s snapshot
        (``savepoint``: a savepoint's, whose keyed state is written canonically)."""
        return OperatorSnapshot(self.backend.snapshot(savepoint) if self.backend is not None
                                else None)

    def notify_complete(self, checkpoint_id: int) -> None:
        pass

    def notify_aborted(self, checkpoint_id: int) -> None:
        pass

    def process_watermark(self, watermark: float) -> list[Any]:
        """The input's event time advanced to ``watermark``; returns records
        (of timers that fired)."""
        return []

    def next_processing_timer(self) -> float | None:
        """When the earliest processing-time timer is due (ms since the
        epoch), or None: the task's loop wakes up for it."""
        return None

    def process_processing_time(self, now: int) -> list[Any]:
        """Processing time reached ``now``; returns records (of timers that fired)."""
        return []

    def end_input(self) -> list[Any]:
        return []

    def finish(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class MapOperator(StreamOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        fn = self.spec.fn
        return [fn(r) for r in batch]


class FilterOperator(StreamOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        fn = self.spec.fn
        return [r for r in batch if fn(r)]


class FlatMapOperator(StreamOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        fn = self.spec.fn
        return [o for r in batch for o in fn(r)]


class MapBatchOperator(StreamOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        out = self.spec.fn(batch)
        return out if isinstance(out, list) else list(out)


class KeyedOperator(StreamOperator):
    """An operator with keyed state: its task's key groups."""

    keyed = True

    def open(self, serializer: StateSerializer) -> None:
        self.backend = open_keyed_backend(self, serializer)


def open_keyed_backend(op: StreamOperator, serializer: StateSerializer) -> KeyedStateBackend:
    """The keyed state of ``op``'s key groups, in the job's backend."""
    info = op.info
    kg = key_group_range(info.task_index, info.parallelism, info.max_parallelism)
    return create_keyed_backend(
        op.state_backend, info.max_parallelism, kg, serializer,
        BackendScope(info.job_id, op.uid, info.task_index, info.attempt, op.job_dir))


class ReduceOperator(KeyedOperator):
    """Keeps one value per key; emits every updated value.

    The function may mutate and return its first argument (``a[1] += b[1];
    return a``, the fold style of PySpark): a mutable accumulator is copied
    before the function sees it, so the stored value (which a snapshot may be
    writing) and every record emitted before stay as they were, and the
    emitted record is never the stored object, so an operator downstream that
    changes its input in place cannot change the state. Immutable
    accumulators (numbers, strings, tuples of them) are never copied."""

    STATE = ValueStateDescriptor("reduce")

    def open(self, serializer: StateSerializer) -> None:
        super().open(serializer)
        assert self.backend is not None
        self.backend.get_state(self.STATE)
        self._values = self.backend.raw(self.STATE.name)
        self._only_immutable: bool | None = None

    def process(self, batch: list[Any]) -> list[Any]:
        fn, key_of, values = self.spec.fn, self.spec.key_selector, self._values
        get = values.get
        out: list[Any] = []
        append = out.append
        missing = _MISSING
        atomic = ATOMIC
        records = iter(batch)
        if self._only_immutable is None:  # first batch: what a restore brought
            # (a RocksDB view decodes a new object each read: copying it is
            # the only cost, and its values are never all scanned)
            self._only_immutable = type(values) is dict and all(
                map(immutable, values.values()))
        if self._only_immutable:
            # Every stored value is immutable (atomic, or a tuple of atomic
            # values): nothing to copy until a function returns another
            # value (a type test a record, one per item of a tuple; a pair,
            # the common tuple, tested item by item without an iterator).
            of_atomic = atomic.issuperset
            for r in records:
                k = key_of(r)
                try:
                    v = fn(values[k], r)
                except KeyError:
                    if k in values:
                        raise  # the function's own KeyError
                    v = r
                c = v.__class__
                if c in atomic or c is tuple and (
                        type(v[0]) in atomic and type(v[1]) in atomic if len(v) == 2
                        else of_atomic(map(type, v))):
                    values[k] = v
                    append(v)
                else:
                    self._only_immutable = False
                    values[k] = private_copy(v)
                    append(v)
                    break
        for r in records:  # the rest of the batch, once a mutable value was stored
            k = key_of(r)
            old = get(k, missing)
            if old is missing:
                v = r
            elif old.__class__ in atomic:
                v = fn(old, r)
            else:
                v = fn(private_copy(old), r)
            values[k] = v if v.__class__ in atomic else private_copy(v)
            append(v)
        return out


_MISSING = object()


class KeyedContext(RuntimeContext):
    """The ``RuntimeContext`` of a keyed operator's user functions."""

    def __init__(self, op: StreamOperator, timers: TimerService) -> None:
        self._op = op
        self._timers = timers
        self.task_index = op.info.task_index
        self.parallelism = op.info.parallelism
        self.attempt = op.info.attempt
        self.uid = op.uid
        self.time_domain: TimeDomain | None = None
        self.ttl_states: TtlStates | None = None
        """The states as user functions see them: with TTL wrapped (state/ttl.py)."""

    @property
    def current_key(self) -> Any:
        assert self._op.backend is not None
        return self._op.backend.current_key

    @property
    def timer_service(self) -> TimerService:
        return self._timers

    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        state: ValueState = self._state(descriptor, ValueStateDescriptor)
        return state

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        state: ListState = self._state(descriptor, ListStateDescriptor)
        return state

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        state: MapState = self._state(descriptor, MapStateDescriptor)
        return state

    def output(self, tag: OutputTag, value: Any) -> None:
        if not isinstance(tag, OutputTag):
            raise TypeError(f"ctx.output takes an OutputTag, got {tag!r}")
        self._op.emit_side(tag.name, value)

    def _state(self, descriptor: object, expected: type) -> Any:
        if not isinstance(descriptor, expected):
            raise PipelineDefinitionError(
                f"expected a {expected.__name__}, got {type(descriptor).__name__}"
            )
        assert self._op.backend is not None
        if self.ttl_states is None:
            self.ttl_states = TtlStates(self._op.backend)
        return self.ttl_states.get_state(descriptor)  # type: ignore[call-overload]


@contextmanager
def user_hook(uid: str, hook: str) -> Iterator[None]:
    """Report an exception of a user function's hook as ``UserFunctionError``
    naming the operator (``process`` is wrapped by the task's chain loop)."""
    try:
        yield
    except LockgateError:
        raise
    except Exception as e:
        raise hook_error(uid, hook, e) from e


def hook_error(uid: str, hook: str, e: Exception) -> UserFunctionError:
    """The error ``user_hook`` raises for ``e`` (also for a hook called
    per record, where a context manager per call would cost too much)."""
    return UserFunctionError(f"operator {uid!r} raised {type(e).__name__} in {hook}(): {e}")


def fire_timers(op: StreamOperator, on_timer: Callable[[int, Any], Any], ctx: KeyedContext,
                due: Iterator[tuple[Any, int]], domain: TimeDomain) -> list[Any]:
    """Call ``on_timer(timestamp, ctx)`` for each due ``(key, timestamp)``
    with that key current in ``op``'s backend; what it returns is emitted."""
    backend = op.backend
    assert backend is not None
    out: list[Any] = []
    ctx.time_domain = domain
    try:
        with user_hook(op.uid, "on_timer"):
            for key, ts in due:
                backend.current_key = key
                res = on_timer(ts, ctx)
                if res is not None:
                    out.extend(res)
    finally:
        ctx.time_domain = None
    return out


class ProcessOperator(KeyedOperator):
    """Runs a user ``KeyedProcessFunction``."""

    has_processing_timers = True

    def open(self, serializer: StateSerializer) -> None:
        super().open(serializer)
        assert self.backend is not None
        self.fn: KeyedProcessFunction[Any, Any] = self.spec.fn
        self.timers = KeyedTimers(self.backend)
        self.ctx = KeyedContext(self, self.timers)
        with user_hook(self.uid, "open"):
            self.fn.open(self.ctx)

    def process_watermark(self, watermark: float) -> list[Any]:
        return self._fire(self.timers.due(watermark), TimeDomain.EVENT_TIME)

    def next_processing_timer(self) -> float | None:
        return self.timers.processing.next_timestamp()

    def process_processing_time(self, now: int) -> list[Any]:
        return self._fire(self.timers.due_processing(now), TimeDomain.PROCESSING_TIME)

    def _fire(self, due: Iterator[tuple[Any, int]], domain: TimeDomain) -> list[Any]:
        return fire_timers(self, self.fn.on_timer, self.ctx, due, domain)

    def process(self, batch: list[Any]) -> list[Any]:
        backend, key_of, fn, ctx = self.backend, self.spec.key_selector, self.fn, self.ctx
        assert backend is not None
        out: list[Any] = []
        extend = out.extend
        element = fn.process_element
        for r in batch:
            backend.current_key = key_of(r)
            res = element(r, ctx)
            if res is not None:
                extend(res)
        if ctx.ttl_states is not None and ctx.ttl_states.per_record:
            ctx.ttl_states.records_processed(len(batch))  # TTL: incremental cleanup
        return out

    def end_input(self) -> list[Any]:
        with user_hook(self.uid, "end_input"):
            return list(self.fn.end_input(self.ctx) or [])

    def finish(self) -> list[Any]:
        with user_hook(self.uid, "finish"):
            return list(self.fn.finish(self.ctx) or [])

    def close(self) -> None:
        self.fn.close()


class SinkOperator(StreamOperator):
    """Hands batches to the sink's writer; its state is the writer's pre-committed
    transactions, unioned over all tasks on restore."""

    operator_state_mode = OperatorStateMode.UNION

    def __init__(self, spec: OperatorSpec, info: TaskInfo) -> None:
        super().__init__(spec, info)
        self.writer: SinkWriter[Any] = spec.fn.create_writer(info)

    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        if committed:
            self.writer.restore_sent(entries or [])
        else:
            self.writer.restore(entries or [])

    def process(self, batch: list[Any]) -> list[Any]:
        if batch:
            if not isinstance(cast(Any, batch), list) and not self.writer.accepts_arrow:
                batch = cast(Any, batch).to_pylist()  # a pyarrow.RecordBatch, to rows
            self.writer.write_batch(batch)
            self.written += len(batch)
        return []

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        return OperatorSnapshot(None, self.writer.snapshot_state(checkpoint_id))

    def notify_complete(self, checkpoint_id: int) -> None:
        self.writer.notify_checkpoint_complete(checkpoint_id)

    def notify_aborted(self, checkpoint_id: int) -> None:
        self.writer.notify_checkpoint_aborted(checkpoint_id)

    def finish(self) -> list[Any]:
        self.writer.finish()
        return []

    def close(self) -> None:
        self.writer.close()


class SourceOperator(StreamOperator):
    """Head of a source chain: polls the source's reader for batches."""

    def __init__(self, spec: OperatorSpec, info: TaskInfo) -> None:
        super().__init__(spec, info)
        self.reader: SourceReader[Any] = spec.fn.create_reader(info)

    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        self.reader.restore(entries)

    def poll(self, max_records: int) -> list[Any] | None:
        return self.reader.poll(max_records)

    def backlog(self) -> int | None:
        """The reader's backlog (from the metrics thread), checked: None when
        it cannot tell, or answers something else than a count."""
        try:
            value = self.reader.backlog()
        except Exception:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
        return min(value, 1 << 62)

    def process(self, batch: list[Any]) -> list[Any]:
        return batch

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        return OperatorSnapshot(None, self.reader.snapshot_state(checkpoint_id))

    def notify_complete(self, checkpoint_id: int) -> None:
        self.reader.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.reader.close()

