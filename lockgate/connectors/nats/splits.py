"""The splits of a JetStream source and their positions — pure, no I/O.

A split is one subject filter of one stream (``None``: the whole stream);
its position is the next *stream sequence* to read. Stream sequences are
the stream's, not the subject's: a split over ``orders.eu`` reading from
sequence 1,000 skips the other subjects' messages between its own.
"""

from __future__ import annotations

from typing import Any

from lockgate.errors import LockgateError

__all__ = ["subjects_overlap", "check_disjoint", "split_entry", "deal_subject_splits",
           "unfinished"]


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both NATS subject filters ``a`` and
    ``b`` (``*`` matches one token, ``>`` one or more at the end)."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


def check_disjoint(subjects: list[str]) -> None:
    """Refuse subject filters that overlap: a message matching two splits
    would be read twice."""
    for i, a in enumerate(subjects):
        for b in subjects[i + 1:]:
            if subjects_overlap(a, b):
                raise LockgateError(
                    f"JetStream source: the subject filters {a!r} and {b!r} overlap, so "
                    "their common messages would be read twice; give disjoint filters")


def split_entry(entry: Any, stream: str) -> dict[str, Any]:
    """A restored split entry, validated (checkpoints are untrusted input)."""
    ok = (isinstance(entry, dict)
          and entry.get("stream") == stream
          and (entry.get("subject") is None or isinstance(entry.get("subject"), str))
          and type(entry.get("next")) is int and entry["next"] >= 1
          and (entry.get("end") is None or type(entry.get("end")) is int))
    if not ok:
        raise LockgateError(
            f"JetStream source: restored state entry {entry!r:.200} is not a position in "
            f"stream {stream!r}; restore with the source that wrote the checkpoint, or give "
            "this source a new uid to start without its state")
    return {"stream": stream, "subject": entry["subject"], "next": entry["next"],
            "end": entry["end"]}


def deal_subject_splits(entries: list[Any], fresh: list[dict[str, Any]], stream: str,
                        task_index: int, parallelism: int) -> list[dict[str, Any]]:
    """The splits task ``task_index`` of ``parallelism`` reads after a
    restore, from every task's restored entries (union state).

    ``fresh`` are the configured splits the checkpoint does not know (a
    subject added since), at their start position. At the parallelism that
    wrote the entries (each says its ``owner`` and the parallelism ``of``
    it), every task takes its own back, and the fresh splits are dealt
    round-robin; otherwise every split is dealt again, in the order of its
    subject, the same way by every task. A split is never cut: tasks beyond
    the number of splits read nothing."""
    splits = [split_entry(e, stream) for e in entries]
    known = {s["subject"] for s in splits}
    added = sorted((f for f in fresh if f["subject"] not in known),
                   key=lambda s: s["subject"] or "")
    if entries and all(isinstance(e, dict) and e.get("of") == parallelism for e in entries):
        own = [s for s, e in zip(splits, entries, strict=True) if e.get("owner") == task_index]
        return own + added[task_index::parallelism]
    every = sorted(splits + added, key=lambda s: s["subject"] or "")
    return every[task_index::parallelism]


def unfinished(split: dict[str, Any]) -> bool:
    """The split has sequences left to read (always, for an unbounded one)."""
    return split["end"] is None or split["next"] <= split["end"]
