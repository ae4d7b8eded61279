"""Timers as keyed state: firing order, de-duplication, deletion, event time
and processing time apart, and a snapshot restored into other key-group
ranges (rescaling)."""

from __future__ import annotations

import io
import time

import pytest

from lockgate import MAX_WATERMARK, WatermarkStrategy
from lockgate.runtime.timers import PROCESSING_TIMERS_STATE, TIMERS_STATE, KeyedTimers
from lockgate.state.backend import HeapKeyedStateBackend
from lockgate.state.keygroups import key_group_range
from lockgate.state.serde import StateSerializer

M = 16


def backend(index: int = 0, parallelism: int = 1) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(M, key_group_range(index, parallelism, M), StateSerializer())


def register(timers: KeyedTimers, key, *stamps: int) -> None:
    timers.backend.current_key = key
    for ts in stamps:
        timers.register_event_time_timer(ts)


def test_timers_fire_in_timestamp_order_once_each() -> None:
    timers = KeyedTimers(backend())
    register(timers, "a", 30, 10, 10)  # the same timer twice fires once
    register(timers, "b", 20, 10)
    assert list(timers.due(9)) == []
    assert timers.current_watermark() == 9
    fired = list(timers.due(20))
    assert sorted(ts for _, ts in fired) == [10, 10, 20]
    assert [ts for _, ts in fired] == sorted(ts for _, ts in fired)
    assert sorted(fired) == [("a", 10), ("b", 10), ("b", 20)]
    assert list(timers.due(MAX_WATERMARK)) == [("a", 30)]
    assert timers.backend.raw(TIMERS_STATE) == {}  # nothing left in state


def test_an_operator_without_timers_keeps_no_timer_state() -> None:
    timers = KeyedTimers(backend())
    assert list(timers.due(MAX_WATERMARK)) == []
    assert timers.current_watermark() == MAX_WATERMARK
    assert TIMERS_STATE not in timers.backend.state_kinds()  # savepoint inspect shows none


def test_deleted_timer_does_not_fire_and_can_be_registered_again() -> None:
    timers = KeyedTimers(backend())
    register(timers, "a", 5, 7)
    timers.delete_event_time_timer(5)
    timers.delete_event_time_timer(99)  # no such timer: nothing happens
    assert list(timers.due(6)) == []
    register(timers, "a", 5)  # deleted and registered again: fires once
    assert list(timers.due(7)) == [("a", 5), ("a", 7)]


def test_a_timer_registered_while_firing_is_due_too() -> None:
    timers = KeyedTimers(backend())
    register(timers, "a", 1)
    fired = []
    for key, ts in timers.due(10):
        fired.append(ts)
        if ts == 1:
            register(timers, key, 4)
    assert fired == [1, 4]


@pytest.mark.parametrize("parallelism", [1, 3, 4])
def test_timers_are_restored_by_key_group_at_another_parallelism(parallelism: int) -> None:
    source = KeyedTimers(backend())
    keys = list(range(40))
    for k in keys:
        register(source, k, 100 + k, 200)
        source.register_processing_time_timer(5_000 + k)  # (key k is current)
    out = io.BytesIO()
    handle = source.backend.snapshot().write(out)
    data = out.getvalue()
    fired, fired_processing = [], []
    for index in range(parallelism):
        restored = KeyedTimers(backend(index, parallelism))
        for kg, (offset, length) in handle.key_groups.items():
            if kg in restored.backend.key_group_range:
                restored.backend.restore_block(data[offset:offset + length], handle.states)
        fired += list(restored.due(MAX_WATERMARK))
        fired_processing += list(restored.due_processing(10_000))
    assert sorted(fired) == sorted([(k, 100 + k) for k in keys] + [(k, 200) for k in keys])
    assert sorted(fired_processing) == [(k, 5_000 + k) for k in keys]


def test_processing_time_timers_are_apart_from_event_time_timers() -> None:
    timers = KeyedTimers(backend())
    assert timers.processing.next_timestamp() is None
    assert PROCESSING_TIMERS_STATE not in timers.backend.state_kinds()
    timers.backend.current_key = "a"
    timers.register_processing_time_timer(30)
    timers.register_processing_time_timer(10)
    timers.register_processing_time_timer(10)  # once per key and timestamp
    timers.register_event_time_timer(10)
    timers.backend.current_key = "b"
    timers.register_processing_time_timer(20)
    timers.delete_processing_time_timer(20)
    timers.register_processing_time_timer(25)
    assert timers.processing.next_timestamp() == 10
    assert list(timers.due(MAX_WATERMARK)) == [("a", 10)]  # the event-time one only
    assert list(timers.due_processing(9)) == []
    assert list(timers.due_processing(25)) == [("a", 10), ("b", 25)]
    assert timers.processing.next_timestamp() == 30
    assert timers.backend.raw(PROCESSING_TIMERS_STATE) == {"a": {30: None}}
    assert timers.backend.raw(TIMERS_STATE) == {}
    assert abs(timers.current_processing_time() / 1000 - time.time()) < 60


def test_watermark_strategy() -> None:
    s = WatermarkStrategy(lambda r: r["ts"], max_out_of_orderness=5)
    assert s.watermark_after([{"ts": 10}, {"ts": 30}, {"ts": 20}]) == 24
    with pytest.raises(ValueError, match="max_out_of_orderness"):
        WatermarkStrategy(lambda r: r, max_out_of_orderness=-1)
    with pytest.raises(ValueError, match="idle_timeout"):
        WatermarkStrategy(lambda r: r, idle_timeout=0)
    with pytest.raises(TypeError, match="timestamp_of"):
        WatermarkStrategy("ts")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1.5, "10", None, True])
def test_a_timestamp_that_is_not_an_integer_is_a_clear_error(bad) -> None:
    timers = KeyedTimers(backend())
    timers.backend.current_key = "a"
    for register in (timers.register_event_time_timer, timers.register_processing_time_timer):
        with pytest.raises(TypeError, match="timer's timestamp must be an integer.*int()"):
            register(bad)
    assert timers.processing.next_timestamp() is None  # nothing was registered
