"""``AsyncOperator`` driven directly, as a task's chain drives it: a
coroutine whose requests the test releases one by one (asyncio events on the
operator's own loop), so order, capacity, snapshots and restores are checked
at exact moments, without timing. The integration and fault tests run it in
real jobs against a real service."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lockgate.api.async_io import AsyncFunction, as_async_function
from lockgate.api.plan import OperatorKind
from lockgate.connectors.base import TaskInfo
from lockgate.errors import PipelineDefinitionError, UserFunctionError
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.runtime.async_io import AsyncOperator
from lockgate.state.serde import StateSerializer


class Gated(AsyncFunction):
    """``invoke(x)`` returns ``x * 10`` once the test ``release``s ``x``."""

    def __init__(self) -> None:
        self.started: list[int] = []

    async def open(self, ctx):
        self.loop = asyncio.get_running_loop()
        self.gates: dict[int, asyncio.Event] = {}

    def gate(self, x: int) -> asyncio.Event:
        return self.gates.setdefault(x, asyncio.Event())

    async def invoke(self, x):
        self.started.append(x)
        await self.gate(x).wait()
        if x < 0:
            raise ValueError(f"bad {x}")
        return x * 10

    def release(self, *xs: int) -> None:
        done = threading.Event()

        def go() -> None:
            for x in xs:
                self.gate(x).set()
            done.set()

        self.loop.call_soon_threadsafe(go)
        assert done.wait(10)


def make(fn, *, capacity: int = 4, ordered: bool = True, timeout: float | None = None,
         on_timeout=None) -> AsyncOperator:
    spec = as_async_function(fn, capacity=capacity, ordered=ordered, timeout=timeout,
                             on_timeout=on_timeout)
    op = AsyncOperator(OperatorSpec("lookup", OperatorKind.ASYNC_MAP, spec),
                       TaskInfo("job", "lookup", 0, 1, 128, 0))
    op.open(StateSerializer())
    return op


def emitted_until(op: AsyncOperator, n: int, timeout: float = 10.0) -> list:
    """What the processing-time hook emits until ``n`` results came."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {out} of {n} results"
        if op.next_processing_timer() == 0:
            out += op.process_processing_time(0)
        else:
            time.sleep(0.001)
    return out


def test_ordered_results_wait_for_the_head():
    fn = Gated()
    op = make(fn)
    try:
        assert op.process([1, 2, 3]) == []
        fn.release(3, 2)
        time.sleep(0.05)
        assert op.process_processing_time(0) == []  # 1 still in flight
        fn.release(1)
        assert emitted_until(op, 3) == [10, 20, 30]
    finally:
        op.close()


def test_unordered_results_come_as_they_complete():
    fn = Gated()
    op = make(fn, ordered=False)
    try:
        op.process([1, 2, 3])
        fn.release(3)
        assert emitted_until(op, 1) == [30]
        fn.release(1)
        assert emitted_until(op, 1) == [10]
        assert op.snapshot(1).operator_state == [2]
    finally:
        fn.release(2)
        op.close()


@pytest.mark.parametrize("ordered", [True, False])
def test_a_snapshot_holds_every_record_not_emitted_and_a_restore_asks_again(ordered):
    fn = Gated()
    op = make(fn, ordered=ordered)
    try:
        op.process([1, 2, 3])
        fn.release(2)  # done but (ordered) not emitted, or emitted (unordered)
        emitted = op.process_processing_time(0) if ordered else emitted_until(op, 1)
        assert emitted == ([] if ordered else [20])
        state = op.snapshot(7).operator_state
        assert state == ([1, 2, 3] if ordered else [1, 3])
    finally:
        fn.release(1, 3)
        op.close()
    again = Gated()
    restored = make(again, ordered=ordered)
    try:
        restored.restore_operator_state(state)
        restored.process([4])
        again.release(*state, 4)
        out = emitted_until(restored, len(state) + 1)
        assert (out if ordered else sorted(out)) == [x * 10 for x in state] + [40]
        assert sorted(again.started) == sorted([*state, 4])
    finally:
        restored.close()


def test_capacity_blocks_until_there_is_room():
    fn = Gated()
    op = make(fn, capacity=2)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(op.process([1, 2, 3])))
    worker.start()
    deadline = time.monotonic() + 10
    while len(fn.started) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    worker.join(0.2)
    assert worker.is_alive() and sorted(fn.started) == [1, 2]  # 3 waits for room
    fn.release(1)
    worker.join(10)
    assert result == [[10]] and op.snapshot(1).operator_state == [2, 3]
    fn.release(2, 3)
    assert emitted_until(op, 2) == [20, 30]
    op.close()


def test_a_watermark_waits_for_every_request_before_it():
    fn = Gated()
    op = make(fn, ordered=False)
    op.process([1, 2])
    threading.Timer(0.2, fn.release, (2, 1)).start()
    assert sorted(op.process_watermark(1_000)) == [10, 20]
    assert op.snapshot(1).operator_state == []
    op.close()


def test_timeouts_give_the_handler_or_fail():
    async def never(x):
        await asyncio.sleep(60)

    op = make(never, timeout=0.05, on_timeout=lambda x: ("late", x))
    op.process([5])
    assert emitted_until(op, 1) == [("late", 5)]
    op.close()
    op = make(never, timeout=0.05)
    op.process([6])
    with pytest.raises(UserFunctionError, match="'lookup'.*6.*timed out after 0.05 s"):
        emitted_until(op, 1)
    op.close()


def test_an_error_names_the_operator_and_the_record():
    fn = Gated()
    op = make(fn)
    op.process([1, -2])
    fn.release(-2)
    with pytest.raises(UserFunctionError, match=r"'lookup' raised ValueError .* record -2"):
        emitted_until(op, 1)
    fn.release(1)
    op.close()


def test_async_map_checks_its_arguments():
    async def f(x):
        return x

    with pytest.raises(PipelineDefinitionError, match="async def or an AsyncFunction"):
        as_async_function(lambda x: x, capacity=1, ordered=True, timeout=None, on_timeout=None)
    with pytest.raises(PipelineDefinitionError, match="capacity"):
        as_async_function(f, capacity=0, ordered=True, timeout=None, on_timeout=None)
    with pytest.raises(PipelineDefinitionError, match="timeout"):
        as_async_function(f, capacity=1, ordered=True, timeout=-1, on_timeout=None)
