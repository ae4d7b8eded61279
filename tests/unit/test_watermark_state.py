"""The watermark an event-time operator restores (``runtime/watermark_state.py``)."""

from __future__ import annotations

import pytest

from lockgate.errors import CheckpointCorruptError
from lockgate.runtime.watermark_state import restored_watermark, watermark_entry


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


@pytest.mark.parametrize("entry", [[0, 2], [2, 2, 5], [0, 2, "5"], [0, 2, float("nan")],
                                   [True, 2, 5], {"w": 1}, "x", True])
def test_a_malformed_entry_is_refused(entry: object) -> None:
    with pytest.raises(CheckpointCorruptError, match="operator 'sums'"):
        restored_watermark([entry], 0, 2, "operator 'sums'")
