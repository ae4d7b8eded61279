"""The watermark an event-time operator keeps in its checkpoints. Pure.

Window and interval-join operators decide lateness by their watermark, so
they checkpoint it: each subtask writes one union operator-state entry
``[subtask, parallelism, watermark]``; an operator of several inputs that
judges each input by its own watermark (the interval join) adds them:
``[subtask, parallelism, watermark, [input 0's, input 1's]]``. In an
unaligned checkpoint subtasks snapshot at different points of their input
(each before the in-flight data it stores), so their watermarks differ; the
smallest would let a subtask admit records it had judged late before the
failure. So:

* at the parallelism of the checkpoint, every subtask restores its own
  watermarks: with the in-flight data replayed after them, it judges every
  record as the run without the failure did;
* at another parallelism (a rescale; savepoints and aligned checkpoints,
  where every subtask's watermarks are the same), and for entries of older
  checkpoints (a bare number each), the smallest of all entries (per input
  for the inputs' own): event time never goes back behind any subtask's,
  and never moves ahead of one. An entry without the inputs' own
  watermarks stands for each input with its watermark.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lockgate.errors import CheckpointCorruptError

__all__ = ["watermark_entry", "restored_watermark", "restored_watermarks"]

MAX_INPUTS = 16
"""Inputs' own watermarks an entry may hold (read back: untrusted)."""


def watermark_entry(subtask: int, parallelism: int, watermark: float,
                    inputs: Sequence[float] | None = None) -> list[Any]:
    """The operator-state entry of ``subtask``'s ``watermark`` (and its
    inputs' own, ``inputs``)."""
    entry: list[Any] = [subtask, parallelism, watermark]
    if inputs is not None:
        entry.append(list(inputs))
    return entry


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not (
        isinstance(v, float) and math.isnan(v))


def restored_watermarks(entries: list[Any] | None, subtask: int, parallelism: int,
                        what: str, inputs: int = 0) -> tuple[float, list[float]] | None:
    """The watermark subtask ``subtask`` of ``parallelism`` restores from the
    union ``entries`` read back from a checkpoint (untrusted; ``what`` names
    the operator in the error), and those of its ``inputs`` inputs, or None
    where there is none."""
    own: dict[int, tuple[float, list[float]]] = {}
    marks: list[tuple[float, list[float]]] = []
    tagged = True
    for e in entries or ():
        if _number(e):  # an older checkpoint's bare watermark
            marks.append((float(e), [float(e)] * inputs))
            tagged = False
            continue
        if not (isinstance(e, list | tuple) and len(e) in (3, 4) and type(e[0]) is int
                and type(e[1]) is int and 0 <= e[0] < e[1] and _number(e[2])
                and (len(e) == 3 or isinstance(e[3], list | tuple) and len(e[3]) <= MAX_INPUTS
                     and all(_number(w) for w in e[3]))):
            raise CheckpointCorruptError(f"{what}: a watermark entry is malformed: {e!r:.60}")
        per_input = ([float(w) for w in e[3]] if len(e) == 4 and len(e[3]) == inputs
                     else [float(e[2])] * inputs)
        mark = (float(e[2]), per_input)
        marks.append(mark)
        if e[1] != parallelism or e[0] in own:
            tagged = False
        own[e[0]] = mark
    if not marks:
        return None
    if tagged and sorted(own) == list(range(parallelism)):
        return own[subtask]
    return (min(m for m, _ in marks),
            [min(m[i] for _, m in marks) for i in range(inputs)])


def restored_watermark(entries: list[Any] | None, subtask: int, parallelism: int,
                       what: str) -> float | None:
    """:func:`restored_watermarks` of an operator of one input."""
    restored = restored_watermarks(entries, subtask, parallelism, what)
    return None if restored is None else restored[0]
