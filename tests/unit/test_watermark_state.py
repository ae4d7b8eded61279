"""The watermark an event-time operator restores (``runtime/watermark_state.py``)."""

from __future__ import annotations

import pytest

from lockgate.errors import CheckpointCorruptError
from lockgate.runtime.watermark_state import (
    restored_watermark,
    restored_watermarks,
    watermark_entry,
)


def test_each_subtask_restores_its_own_at_the_same_parallelism() -> None:
    entries = [watermark_entry(1, 2, 2_860_599), watermark_entry(0, 2, 2_858_499)]
    assert restored_watermark(entries, 0, 2, "op") == 2_858_499
    assert restored_watermark(entries, 1, 2, "op") == 2_860_599


def test_another_parallelism_or_older_entries_restore_the_smallest() -> None:
    entries = [watermark_entry(0, 2, 500), watermark_entry(1, 2, 700)]
    assert [restored_watermark(entries, i, 3, "op") for i in range(3)] == [500] * 3
    assert restored_watermark(entries[:1], 0, 2, "op") == 500  # one missing: smallest
    assert restored_watermark([300, 400.5], 1, 2, "op") == 300  # a bare number each
    assert restored_watermark(None, 0, 1, "op") is None
    assert restored_watermark([], 0, 1, "op") is None


def test_the_inputs_own_watermarks_restore_alike() -> None:
    entries = [watermark_entry(0, 2, 100, [400, 100]), watermark_entry(1, 2, 90, [90, 300])]
    assert restored_watermarks(entries, 0, 2, "op", inputs=2) == (100, [400, 100])
    assert restored_watermarks(entries, 1, 2, "op", inputs=2) == (90, [90, 300])
    # another parallelism: the smallest per input
    assert restored_watermarks(entries, 2, 3, "op", inputs=2) == (90, [90, 100])
    # entries without them (older checkpoints): the watermark for each input
    assert restored_watermarks([watermark_entry(0, 1, 70)], 0, 1, "op", inputs=2) == (
        70, [70, 70])
    assert restored_watermarks([50], 0, 1, "op", inputs=2) == (50, [50, 50])
    assert restored_watermark(entries, 1, 2, "op") == 90


@pytest.mark.parametrize("entry", [[0, 2], [2, 2, 5], [0, 2, "5"], [0, 2, float("nan")],
                                   [True, 2, 5], {"w": 1}, "x", True, [0, 2, 5, 6],
                                   [0, 2, 5, [1, "2"]], [0, 2, 5, [0] * 17], [0, 2, 5, [1], 3]])
def test_a_malformed_entry_is_refused(entry: object) -> None:
    with pytest.raises(CheckpointCorruptError, match="operator 'sums'"):
        restored_watermark([entry], 0, 2, "operator 'sums'")
