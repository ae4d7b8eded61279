"""``AsyncOperator``: the runtime of ``DataStream.async_map`` (api/async_io.py).

Each task of the operator runs one asyncio event loop in a thread of its own.
The task thread hands the records of a batch to the loop in one call
(``call_soon_threadsafe``), which starts one request (an asyncio task) per
record; a finished request marks its entry done under the operator's lock.
Entries wait in a queue until they are emitted:

* ordered: the done prefix of the queue, in input order;
* unordered: every done entry, in completion order.

At most ``capacity`` entries are queued (in flight or done but not emitted,
as in Flink): ``process`` blocks for room, emitting what is done meanwhile.
Results that complete between batches leave through the processing-time
hook the task's loop already has (``next_processing_timer``: due at once
when a result is ready); the request that makes one ready wakes the task's
loop from its wait for input (``wake``), so nothing polls.
``process_watermark`` waits for every queued request, so a watermark never
overtakes the result of a record before it (unordered mode too: Flink's rule);
``end_input`` waits for every request too.

A snapshot holds the input records of every queued entry, in input order, as
operator state (split: dealt out on rescale); a restored task issues them
again first. So each record's result goes downstream exactly once: before
the barrier (not in the snapshot) or after it (issued again on recovery).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from lockgate.api.async_io import AsyncContext, AsyncFunction, AsyncSpec, AsyncTimeoutError
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.errors import LockgateError, UserFunctionError
from lockgate.runtime.operators import OperatorSnapshot, StreamOperator, user_hook
from lockgate.runtime.timers import processing_time
from lockgate.state.serde import StateSerializer
from lockgate.state.values import private_copy

__all__ = ["AsyncOperator"]

_POLL_MS = 1
"""Outside a task (no ``wake``): while requests are in flight and none is
done, look again after this many milliseconds."""

_HOOK_TIMEOUT = 60.0
"""Seconds the user's ``open`` and ``close`` coroutines may take."""


class _Entry:
    """One record's request: in flight, then done (result, error or timeout)."""

    __slots__ = ("record", "seq", "done", "result", "error", "timed_out")

    def __init__(self, record: Any, seq: int) -> None:
        self.record = record
        self.seq = seq
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.timed_out = False


class AsyncOperator(StreamOperator):
    """Runs an :class:`~lockgate.api.async_io.AsyncFunction` per record with at
    most ``capacity`` requests queued per task."""

    has_processing_timers = True
    operator_state_mode = OperatorStateMode.SPLIT

    def open(self, serializer: StateSerializer) -> None:
        spec: AsyncSpec = self.spec.fn
        self.fn: AsyncFunction[Any, Any] = spec.fn
        self.capacity = spec.capacity
        self.ordered = spec.ordered
        self.timeout = spec.timeout
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: deque[_Entry] = deque()
        """Ordered mode: every entry not yet emitted, in input order."""
        self._pending: dict[int, _Entry] = {}
        """Unordered mode: every entry not yet emitted, by sequence number."""
        self._done: deque[_Entry] = deque()
        """Unordered mode: the done entries, in completion order."""
        self._queued = 0
        self._ready = 0
        self._seq = 0
        self._failure: _Entry | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"async-{self.uid}")
        self._thread.start()
        ctx = AsyncContext(self.uid, self.info.task_index, self.info.parallelism,
                           self.info.attempt)
        with user_hook(self.uid, "open"):
            asyncio.run_coroutine_threadsafe(self.fn.open(ctx), self._loop).result(
                _HOOK_TIMEOUT)

    # ---------------------------------------------------------------- state
    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        """Issue the requests a checkpoint recorded again, before any new one
        (room is not awaited: a restore at a lower parallelism may bring more
        than ``capacity``)."""
        if entries:
            self._start([self._enqueue(r) for r in entries])

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        with self._lock:
            entries = self._queue if self.ordered else self._pending.values()
            records = [private_copy(e.record) for e in entries]
        return OperatorSnapshot(None, records)

    # -------------------------------------------------------------- records
    def process(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        starting: list[_Entry] = []
        capacity = self.capacity
        for record in batch:
            if self._queued >= capacity:
                self._start(starting)
                starting = []
                out.extend(self._emit(wait_for=lambda: self._queued < capacity))
            starting.append(self._enqueue(record))
        self._start(starting)
        if self._ready:
            out.extend(self._emit())
        return out

    def process_watermark(self, watermark: float) -> list[Any]:
        return self._drain()

    def next_processing_timer(self) -> float | None:
        if self._ready or self._failure is not None:
            return 0
        if self.wake is not None:  # a result that becomes ready wakes the task
            return None
        return processing_time() + _POLL_MS if self._queued else None

    def process_processing_time(self, now: int) -> list[Any]:
        return self._emit()

    def end_input(self) -> list[Any]:
        return self._drain()

    def close(self) -> None:
        loop = self._loop
        if loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_HOOK_TIMEOUT)
        except Exception as e:
            if not isinstance(e, LockgateError):
                raise UserFunctionError(
                    f"operator {self.uid!r} raised {type(e).__name__} in close(): {e}") from e
            raise
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(_HOOK_TIMEOUT)
            if not self._thread.is_alive():
                loop.close()

    # ------------------------------------------------------------ internals
    def _enqueue(self, record: Any) -> _Entry:
        entry = _Entry(record, self._seq)
        self._seq += 1
        with self._lock:
            if self.ordered:
                self._queue.append(entry)
            else:
                self._pending[entry.seq] = entry
            self._queued += 1
        return entry

    def _start(self, entries: list[Any]) -> None:
        """Start the requests of ``entries`` on the loop (one cross-thread call)."""
        if entries:
            self._loop.call_soon_threadsafe(self._start_on_loop, entries)

    def _start_on_loop(self, entries: list[_Entry]) -> None:
        for entry in entries:
            task = self._loop.create_task(self._call(entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, entry: _Entry) -> None:
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                result = await self.fn.invoke(entry.record)
        except TimeoutError as e:
            if deadline.expired():  # (not a TimeoutError of the function's own)
                self._complete(entry, None, None, timed_out=True)
            else:
                self._complete(entry, None, e)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self._complete(entry, None, e)
        else:
            self._complete(entry, result, None)

    def _complete(self, entry: _Entry, result: Any, error: BaseException | None,
                  timed_out: bool = False) -> None:
        with self._lock:
            entry.result, entry.error, entry.timed_out = result, error, timed_out
            entry.done = True
            if error is not None and self._failure is None:
                self._failure = entry
            if not self.ordered:
                self._done.append(entry)
                self._ready += 1
            elif self._queue and self._queue[0] is entry:
                self._ready = 1
            self._changed.notify_all()
            wake = self.wake if self._ready or self._failure is not None else None
        if wake is not None:  # the task's loop may be waiting for input: emit now
            wake()

    def _take_done(self) -> list[_Entry]:
        """Under the lock: the entries to emit now, removed from the queue."""
        taken: list[_Entry] = []
        if self.ordered:
            queue = self._queue
            while queue and queue[0].done:
                taken.append(queue.popleft())
        else:
            taken = list(self._done)
            self._done.clear()
            for entry in taken:
                del self._pending[entry.seq]
        self._queued -= len(taken)
        self._ready = 0
        return taken

    def _emit(self, wait_for: Any = None) -> list[Any]:
        """The results to emit now; with ``wait_for`` (a condition on the
        queue), first wait until it holds, emitting what is done meanwhile."""
        out: list[Any] = []
        while True:
            with self._lock:
                if self._failure is not None:
                    self._raise(self._failure)
                taken = self._take_done()
                if not taken and wait_for is not None and not wait_for():
                    self._changed.wait(1.0)
                    continue
            out.extend(self._results(taken))
            if wait_for is None or wait_for():
                return out

    def _drain(self) -> list[Any]:
        return self._emit(wait_for=lambda: self._queued == 0)

    def _results(self, entries: list[_Entry]) -> list[Any]:
        out = []
        for entry in entries:
            if entry.timed_out:
                with user_hook(self.uid, "timeout"):
                    try:
                        out.append(self.fn.timeout(entry.record))
                    except AsyncTimeoutError as e:
                        raise AsyncTimeoutError(
                            f"operator {self.uid!r}: {e} after {self.timeout} s (pass "
                            "on_timeout= or override AsyncFunction.timeout to emit a "
                            "default instead)") from None
            else:
                out.append(entry.result)
        return out

    def _raise(self, entry: _Entry) -> None:
        e = entry.error
        assert e is not None
        try:
            first = repr(entry.record)
        except Exception:
            first = f"<{type(entry.record).__name__}>"
        raise UserFunctionError(
            f"operator {self.uid!r} raised {type(e).__name__} in its async function "
            f"for the record {first[:200]}: {e}") from e

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=_HOOK_TIMEOUT)
        await self.fn.close()
