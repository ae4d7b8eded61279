"""``SequenceSource``: the integers of a range, bounded or not, optionally rate-limited."""

from __future__ import annotations

import time
from typing import Any

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.errors import LockgateError

__all__ = ["SequenceSource"]


class SequenceSource(Source[int]):
    """Emits ``start, start+1, ..., end`` (inclusive), or forever if ``end`` is None.

    Each task reads its own split (a contiguous range when bounded, a stride
    when unbounded); the state of a split is the next number to emit, so the
    source replays exactly from a checkpoint. Restored at another
    parallelism, what is left of every split is dealt out again, so every
    task reads and every number is read once (see :func:`deal_splits`).

    Args:
        start: first number.
        end: last number (inclusive), or None for an unbounded source.
        rate: records per second over all tasks, or None for as fast as possible.
    """

    replayable = True
    operator_state_mode = OperatorStateMode.UNION  # every task sees every split and takes its share

    def __init__(self, start: int, end: int | None = None, *, rate: float | None = None) -> None:
        if end is not None and end < start:
            raise ValueError(f"end ({end}) must be >= start ({start})")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 records/s, got {rate}")
        self.start = start
        self.end = end
        self.rate = rate
        self.bounded = end is not None

    def size_hint(self) -> int | None:
        """The records it reads in all (bounded), for progress bars; None if unbounded."""
        return None if self.end is None else self.end - self.start + 1

    def splits(self, parallelism: int) -> list[dict[str, Any]]:
        """The initial splits, one per task."""
        if self.end is None:
            return [{"split": i, "next": self.start + i, "end": None, "step": parallelism}
                    for i in range(parallelism)]
        total = self.end - self.start + 1
        out = []
        for i in range(parallelism):
            lo = self.start + total * i // parallelism
            hi = self.start + total * (i + 1) // parallelism - 1
            out.append({"split": i, "next": lo, "end": hi, "step": 1})
        return out

    def create_reader(self, info: TaskInfo) -> SequenceReader:
        return SequenceReader(self, info)


def _split(entry: Any) -> dict[str, Any]:
    """A restored split entry, validated (checkpoints are untrusted input)."""
    ok = (isinstance(entry, dict)
          and all(type(entry.get(f)) is int for f in ("split", "next", "step"))
          and entry["step"] > 0
          and (entry.get("end") is None or type(entry.get("end")) is int))
    if not ok:
        raise LockgateError(
            f"sequence source: restored state entry {entry!r} is not a split position; "
            "restore with the source that wrote the checkpoint")
    return {"split": entry["split"], "next": entry["next"], "end": entry.get("end"),
            "step": entry["step"]}


def _unfinished(split: dict[str, Any]) -> bool:
    """The split has numbers left to read."""
    return split["end"] is None or split["next"] <= split["end"]


def _pieces(split: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """What is left of ``split`` cut into at most ``n`` disjoint pieces whose
    union is the rest of the split: contiguous runs of a bounded split, ``n``
    interleaved strides of an unbounded one."""
    nxt, end, step = split["next"], split["end"], split["step"]
    if end is None:
        return [{"next": nxt + j * step, "end": None, "step": step * n} for j in range(n)]
    count = max(0, (end - nxt) // step + 1)
    out = []
    for j in range(n):
        lo, hi = count * j // n, count * (j + 1) // n
        if hi > lo:
            out.append({"next": nxt + lo * step, "end": nxt + (hi - 1) * step, "step": step})
    return out


def deal_splits(entries: list[Any], task_index: int, parallelism: int) -> list[dict[str, Any]]:
    """The splits task ``task_index`` of ``parallelism`` reads after a
    restore, from every task's restored split entries (union state).

    At the parallelism that wrote them (each entry says its ``owner`` task
    and the parallelism ``of`` it), every task takes its own splits back.
    Otherwise what is left of the splits is dealt out again, the same way by
    every task: unfinished splits in a canonical order, round-robin when there
    are at least as many as tasks, else each one cut into ``parallelism``
    pieces first, so every task has work and every number is read once."""
    splits = [_split(e) for e in entries]
    if any("owner" not in e for e in entries):
        # A checkpoint of a version that dealt entries out itself (split
        # mode): these are this task's already.
        return splits
    if all(e.get("of") == parallelism for e in entries):
        return [s for s, e in zip(splits, entries, strict=True) if e["owner"] == task_index]
    left = sorted((s for s in splits if _unfinished(s)),
                  key=lambda s: (s["next"], s["step"], -1 if s["end"] is None else s["end"]))
    if 0 < len(left) < parallelism:
        left = [piece for s in left for piece in _pieces(s, parallelism)]
    for i, s in enumerate(left):
        s["split"] = i
    return left[task_index::parallelism]


class SequenceReader(SourceReader[int]):
    def __init__(self, source: SequenceSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.splits: list[dict[str, Any]] = []
        self.rate = source.rate / info.parallelism if source.rate else None
        self.started = time.monotonic()
        self.emitted = 0
        self._turn = 0

    def restore(self, state: list[Any] | None) -> None:
        if state is None:
            self.splits = [self.source.splits(self.info.parallelism)[self.info.task_index]]
        else:
            self.splits = deal_splits(state, self.info.task_index, self.info.parallelism)

    def poll(self, max_records: int) -> list[int] | None:
        if self.rate is not None:
            allowed = int((time.monotonic() - self.started) * self.rate) - self.emitted
            if allowed <= 0:
                return []
            max_records = min(max_records, allowed)
        splits = self.splits
        # Round-robin over the splits: an unbounded split never ends, and must
        # not starve the splits after it.
        for i in range(len(splits)):
            split = splits[(self._turn + i) % len(splits)]
            if not _unfinished(split):
                continue
            nxt, end, step = split["next"], split["end"], split["step"]
            self._turn = (self._turn + i + 1) % len(splits)
            self.last_split = split["split"]
            stop = nxt + max_records * step
            if end is not None:
                stop = min(stop, end + 1)
            batch = list(range(nxt, stop, step))
            split["next"] = nxt + len(batch) * step
            self.emitted += len(batch)
            return batch
        return None

    def unfinished_splits(self) -> list[Any]:
        return [s["split"] for s in self.splits if _unfinished(s)]

    def backlog(self) -> int | None:
        """Rate-limited: the records due and not read yet; else what is left
        of its bounded splits (None for an unbounded one: without end)."""
        left: int | None = 0
        for s in list(self.splits):
            if s["end"] is None:
                left = None
                break
            assert left is not None
            left += max(0, (s["end"] - s["next"]) // s["step"] + 1)
        if self.rate is None:
            return left
        due = max(0, int((time.monotonic() - self.started) * self.rate) - self.emitted)
        return due if left is None else min(due, left)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        owner, of = self.info.task_index, self.info.parallelism
        return [{**s, "owner": owner, "of": of} for s in self.splits]
