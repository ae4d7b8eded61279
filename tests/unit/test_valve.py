"""A task's event time (``WatermarkValve``), driven without a task or a clock."""

from __future__ import annotations

from lockgate.api.watermarks import MIN_WATERMARK
from lockgate.protocol import IDLE, Watermark
from lockgate.runtime.valve import WatermarkValve


def test_the_smallest_input_watermark_goes_downstream_once_it_advances() -> None:
    v = WatermarkValve(2)
    assert v.input_watermark(0, 100) == []  # channel 1 still at the minimum
    assert v.input_watermark(1, 50) == [Watermark(50)]
    assert v.input_watermark(1, 40) == []  # never backwards
    assert v.input_watermark(1, 200) == [Watermark(100)]
    assert v.watermark == 100


def test_idle_inputs_are_left_out_and_all_idle_makes_the_task_idle() -> None:
    v = WatermarkValve(2)
    v.input_watermark(0, 100)
    assert v.input_idle(1) == [Watermark(100)]  # channel 1 no longer holds it back
    assert v.input_idle(0) == [IDLE]
    assert v.idle
    assert v.input_idle(0) == []  # said once
    assert v.input_watermark(1, 90) == [Watermark(100)]  # active again, never backwards
    assert not v.idle


def test_a_source_emits_at_most_once_per_interval_and_goes_idle_after_the_timeout() -> None:
    v = WatermarkValve(0, interval=1.0, idle_timeout=5.0, now=0.0)
    none = lambda: ()
    assert v.source_polled(0.0, 10, None, none) == [Watermark(10)]
    assert v.source_polled(0.5, 20, None, none) == []  # within the interval
    assert v.source_polled(1.0, None, None, none) == [Watermark(20)]
    assert v.source_polled(4.0, None, None, none) == []
    assert v.source_polled(5.6, None, None, none) == [IDLE]  # 5 s after the last record
    assert v.source_polled(5.7, 30, None, none) == [Watermark(30)]  # active at once
    assert not v.idle


def test_a_source_reading_splits_in_turn_holds_the_smallest_unfinished_split() -> None:
    v = WatermarkValve(0, interval=0.0)
    unfinished = {"a", "b"}
    assert v.source_polled(0.0, 100, "a", lambda: unfinished) == []  # b has said nothing
    assert v.source_polled(0.1, 40, "b", lambda: unfinished) == [Watermark(40)]
    unfinished.discard("b")
    assert v.source_polled(0.2, None, None, lambda: unfinished) == [Watermark(100)]
    unfinished.clear()
    assert v.source_polled(0.3, None, None, lambda: unfinished) == []
    assert v.watermark == 100 and v.watermark > MIN_WATERMARK


def test_each_input_of_several_has_its_own_watermark() -> None:
    """Channels 0 and 1 are input 0, channel 2 input 1: each input's
    watermark is the smallest of its active channels', never going back,
    whatever the other input does."""
    v = WatermarkValve(3, input_of=[0, 0, 1])
    v.input_watermark(0, 100)
    assert v.input_watermarks == [MIN_WATERMARK, MIN_WATERMARK]  # channel 1 said nothing
    v.input_watermark(1, 80)
    v.input_watermark(2, 10)
    assert v.input_watermarks == [80, 10] and v.watermark == 10
    v.input_idle(1)  # input 0 no longer held back by channel 1
    assert v.input_watermarks == [100, 10]
    v.input_watermark(1, 90)  # active again: never backwards
    assert v.input_watermarks == [100, 10]
    v.input_idle(2)  # input 1 all idle: keeps its last
    assert v.input_watermarks == [100, 10] and v.watermark == 90
    assert WatermarkValve(2).input_watermarks == []  # one input: the task's watermark
