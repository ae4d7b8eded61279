"""The watermark an event-time operator keeps in its checkpoints. Pure.

Window and interval-join operators decide lateness by their watermark, so
they checkpoint it: each subtask writes one union operator-state entry
``[subtask, parallelism, watermark]``. In an unaligned checkpoint subtasks
snapshot at different points of their input (each before the in-flight data
it stores), so their watermarks differ; the smallest would let a subtask
admit records it had judged late before the failure. So:

* at the parallelism of the checkpoint, every subtask restores its own
  watermark: with the in-flight data replayed after it, it judges every
  record as the run without the failure did;
* at another parallelism (a rescale; savepoints and aligned checkpoints,
  where every subtask's watermark is the same), and for entries of older
  checkpoints (a bare number each), the smallest of all entries: event time
  never goes back behind any subtask's, and never moves ahead of one.
"""

from __future__ import annotations

import math
from typing import Any

from lockgate.errors import CheckpointCorruptError

__all__ = ["watermark_entry", "restored_watermark"]


def watermark_entry(subtask: int, parallelism: int, watermark: float) -> list[Any]:
    """The operator-state entry of ``subtask``'s ``watermark``."""
    return [subtask, parallelism, watermark]


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not (
        isinstance(v, float) and math.isnan(v))


def restored_watermark(entries: list[Any] | None, subtask: int, parallelism: int,
                       what: str) -> float | None:
    """The watermark subtask ``subtask`` of ``parallelism`` restores from the
    union ``entries`` read back from a checkpoint (untrusted; ``what`` names
    the operator in the error), or None where there is none."""
    own: dict[int, float] = {}
    marks: list[float] = []
    tagged = True
    for e in entries or ():
        if _number(e):  # an older checkpoint's bare watermark
            marks.append(float(e))
            tagged = False
            continue
        if not (isinstance(e, list | tuple) and len(e) == 3 and type(e[0]) is int
                and type(e[1]) is int and 0 <= e[0] < e[1] and _number(e[2])):
            raise CheckpointCorruptError(f"{what}: a watermark entry is malformed: {e!r:.60}")
        marks.append(float(e[2]))
        if e[1] != parallelism or e[0] in own:
            tagged = False
        own[e[0]] = float(e[2])
    if not marks:
        return None
    if tagged and sorted(own) == list(range(parallelism)):
        return own[subtask]
    return min(marks)
