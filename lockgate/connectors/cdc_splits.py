"""Snapshot chunks as splits spread over the tasks of a change data capture
source, and the hand-over from the snapshot to the stream — pure.

The incremental snapshot of Flink CDC, without a split enumerator:

- **Splits.** The driver cuts each table into primary-key chunks before the
  job starts (:func:`initial_entries`). Every chunk is one state entry,
  owned by one task; the log (the stream) is one more entry, owned by task
  0 (one reader per replication slot). State is UNION, so every task sees
  every entry at a restore and takes its share the same way
  (:func:`deal`): the stream to task 0, the chunks with work left
  round-robin in chunk order, the finished ones by their number. A restore
  at another parallelism (a rescale through a savepoint) deals them out
  again, in the middle of the snapshot or in the stream.
- **Chunks.** A task reads each of its chunks as of one log position, the
  chunk's *high watermark* (``hw``), and keeps its rows not yet emitted in
  the entry (``rows``): a chunk is *unread* (``hw`` None), *emitting*
  (rows left) or *done*.
- **Hand-over.** The stream starts once every chunk is done and its rows
  are in a completed checkpoint: its owner knows the chunks done in the
  restored state and its own, and learns the others' from the
  announcements their tasks write to the log after a checkpoint completes
  (:func:`announcement`, :func:`read_announcement`; only those of the
  current run and attempt count, so a chunk read again after a failure is
  never taken for the read that failed). Then it reads the log from the
  job's start on and emits a change of key ``k`` iff it is at or after the
  high watermark of the chunk holding ``k``
  (:func:`stream_watermarks`, Flink CDC's binlog split with the finished
  splits' watermarks). Every change is in a chunk or in the stream, once.

Entries:

- stream: ``{"cdc": 2, "role": "stream", "pos": <the source's position>,
  "hw": None (waiting) | {table: [[upper, hw], ...]}, "ended": bool}`` plus
  the source's own fields;
- chunk: ``{"cdc": 2, "role": "chunk", "id": n, "table": name, "lower": key |
  None, "upper": key | None, "hw": int | None, "ms": int, "rows": [row, ...]}``:
  the rows with ``lower < key <= upper`` (``None``: unbounded); ``ms`` when it
  was read.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockgate.errors import CheckpointCorruptError, ConfigurationError

__all__ = ["initial_entries", "check_entries", "check_restored", "upgrade_v1", "deal", "Share",
           "state_entries",
           "stream_watermarks", "chunk_done", "announcement",
           "read_announcement", "ANNOUNCE_PREFIX"]

ANNOUNCE_PREFIX = "lockgate-cdc-done"
"""The prefix of the log messages that announce committed chunks."""

_MAX_ANNOUNCED = 1_000_000
"""Chunks one announcement may name (a bound on what is parsed)."""


def _key(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def chunk_done(chunk: dict[str, Any]) -> bool:
    """Read, and every row emitted."""
    return chunk["hw"] is not None and not chunk["rows"]


def initial_entries(tables: Sequence[str], boundaries: dict[str, list[list[Any]]] | None,
                    pos: Any, **stream: Any) -> list[dict[str, Any]]:
    """The state of a fresh start reading the log from ``pos``: the stream
    entry (with ``stream``'s fields) and, with ``boundaries`` (a table's
    chunk boundaries in key order: chunk ``j`` holds the keys above boundary
    ``j - 1`` up to boundary ``j``, the last one every key above the last
    boundary), one entry per chunk. ``boundaries`` None: no snapshot, the
    stream emits every change from ``pos`` on."""
    if boundaries is None:
        return [{"cdc": 2, "role": "stream", **stream, "pos": pos,
                 "hw": {t: [[None, 0]] for t in tables}, "ended": False}]
    out: list[dict[str, Any]] = [{"cdc": 2, "role": "stream", **stream, "pos": pos,
                                  "hw": None, "ended": False}]
    n = 0
    for table in tables:
        cuts: list[Any] = [None, *boundaries.get(table, []), None]
        for lower, upper in zip(cuts, cuts[1:], strict=False):
            out.append({"cdc": 2, "role": "chunk", "id": n, "table": table,
                        "lower": None if lower is None else list(lower),
                        "upper": None if upper is None else list(upper),
                        "hw": None, "ms": 0, "rows": []})
            n += 1
    return out


def upgrade_v1(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of a checkpoint written by the single-reader version (one
    entry: ``table`` read up to ``lower``, ``chunks`` done per table,
    ``pending`` rows of the chunk read last): its finished chunks done, the
    rest of the current table and each later table one chunk to read."""
    tables = entry.get("tables")
    if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
        raise CheckpointCorruptError("CDC source: a restored state entry of the earlier "
                                     "format names no tables: restore with the source that "
                                     "wrote the checkpoint")
    extra = {k: v for k, v in entry.items()
             if k not in ("cdc", "table", "lower", "max", "chunks", "pending", "pos", "ended")}
    stream: dict[str, Any] = {"cdc": 2, "role": "stream", **extra, "pos": entry.get("pos"),
                              "hw": None, "ended": bool(entry.get("ended"))}
    at, chunks = entry.get("table"), entry.get("chunks")
    if type(at) is not int or not isinstance(chunks, dict) or not all(
            isinstance(cs, list) and all(isinstance(c, list) and len(c) == 2 for c in cs)
            for cs in chunks.values()):
        raise CheckpointCorruptError(f"CDC source: restored state entry {entry!r:.100} is "
                                     "damaged")
    if at >= len(tables):
        stream["hw"] = chunks
        return [stream]
    out = [stream]
    pending = [p for p in entry.get("pending") or []
               if isinstance(p, list) and len(p) == 4 and type(p[3]) is int]
    n = 0
    for i, table in enumerate(tables):
        lower = None
        for upper, hw in chunks.get(table, []) if i <= at else []:
            mine = [p for p in pending if p[0] == table and p[2] == hw]
            out.append({"cdc": 2, "role": "chunk", "id": n, "table": table, "lower": lower,
                        "upper": upper, "hw": hw, "ms": mine[0][3] if mine else 0,
                        "rows": [p[1] for p in mine]})
            n += 1
            lower = upper
        if i >= at:  # the rest of the table being read, and each later one: to read
            out.append({"cdc": 2, "role": "chunk", "id": n, "table": table,
                        "lower": entry.get("lower") if i == at else None, "upper": None,
                        "hw": None, "ms": 0, "rows": []})
            n += 1
    return out


def _check_chunk(e: dict[str, Any], what: str) -> dict[str, Any]:
    ok = (type(e.get("id")) is int and e["id"] >= 0 and isinstance(e.get("table"), str)
          and all(e.get(f) is None or isinstance(e.get(f), list) for f in ("lower", "upper"))
          and (e.get("hw") is None or (type(e["hw"]) is int and e["hw"] >= 0))
          and type(e.get("ms")) is int and isinstance(e.get("rows"), list)
          and all(isinstance(r, dict) for r in e["rows"])
          and (e.get("hw") is not None or not e["rows"]))
    if not ok:
        raise CheckpointCorruptError(f"{what}: restored chunk {e!r:.100} is damaged: restore "
                                     "with the source that wrote the checkpoint")
    return {k: e[k] for k in ("cdc", "role", "id", "table", "lower", "upper", "hw", "ms",
                              "rows")}


def _check_watermarks(value: Any, what: str) -> dict[str, list[list[Any]]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(t, str) and isinstance(cs, list) and cs and all(
                isinstance(c, list) and len(c) == 2 and type(c[1]) is int
                and (c[0] is None or isinstance(c[0], list)) for c in cs)
            and cs[-1][0] is None and all(c[0] is not None for c in cs[:-1])
            for t, cs in value.items()):
        raise CheckpointCorruptError(f"{what}: the restored chunks' watermarks are damaged")
    return value


def check_entries(entries: Iterable[Any], tables: Sequence[str], what: str,
                  check_position: Callable[[Any], Any]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The stream entry and the chunk entries of a restored state (untrusted:
    shapes, one stream, chunk numbers once each, every table's chunks
    covering its keys in order); earlier formats upgraded. ``what`` names the
    source in errors; ``check_position`` checks the stream's position."""
    flat: list[dict[str, Any]] = []
    for e in entries:
        if not isinstance(e, dict) or e.get("cdc") not in (1, 2):
            continue
        flat.extend(upgrade_v1(e) if e["cdc"] == 1 else [e])
    streams = [e for e in flat if e.get("role") == "stream"]
    if len(streams) != 1 or any(e.get("role") not in ("stream", "chunk") for e in flat):
        raise CheckpointCorruptError(
            f"{what}: the checkpoint holds {len(streams)} stream positions, one expected: "
            "restore with the source that wrote the checkpoint")
    stream = dict(streams[0])
    stream["pos"] = check_position(stream.get("pos"))
    stream["hw"] = _check_watermarks(stream.get("hw"), what)
    stream["ended"] = bool(stream.get("ended"))
    chunks = sorted((_check_chunk(e, what) for e in flat if e["role"] == "chunk"),
                    key=lambda c: c["id"])
    if len({c["id"] for c in chunks}) != len(chunks):
        raise CheckpointCorruptError(f"{what}: the checkpoint holds a chunk twice")
    if stream["hw"] is None:
        if {c["table"] for c in chunks} != set(tables):
            raise ConfigurationError(f"{what}: the tables changed in the middle of the "
                                     "snapshot: restore with the same tables, or start fresh")
        for table in tables:
            _check_cover([c for c in chunks if c["table"] == table], table, what)
    return stream, chunks


def check_restored(state: list[Any] | None, initial: Callable[[], list[dict[str, Any]]],
                   tables: Sequence[str], what: str, check_position: Callable[[Any], Any]
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """:func:`check_entries` of the source's entries in a restored ``state``;
    none (a fresh start): of ``initial()``."""
    entries = [e for e in (state or []) if isinstance(e, dict) and e.get("cdc")]
    return check_entries(entries or initial(), tables, what, check_position)


def _check_cover(chunks: list[dict[str, Any]], table: str, what: str) -> None:
    """A table's chunks, in number order, cover its keys: from no lower
    bound, each one's lower bound the upper of the one before, to no upper."""
    try:
        ok = (chunks[0]["lower"] is None and chunks[-1]["upper"] is None
              and all(a["upper"] is not None and a["upper"] == b["lower"]
                      for a, b in zip(chunks, chunks[1:], strict=False))
              and all(_key(a["upper"]) < _key(b["upper"])  # type: ignore[operator]
                      for a, b in zip(chunks, chunks[1:-1], strict=False)))
    except TypeError:
        ok = False
    if not ok:
        raise CheckpointCorruptError(f"{what}: the restored chunks of {table!r:.60} do not "
                                     "cover its keys in order: the checkpoint is damaged")


def state_entries(stream: dict[str, Any] | None, todo: Iterable[dict[str, Any]],
                  done: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A reader's state: its stream entry (None: not its) and its chunks with
    work left and done, as copies (the reader goes on changing its own)."""
    out = [] if stream is None else [{**stream, "pos": list(stream["pos"])}]
    out += [{**c, "rows": [dict(r) for r in c["rows"]]} for c in todo]
    out += [dict(c) for c in done]
    return out


@dataclass
class Share:
    """What one task reads after a restore."""

    stream: dict[str, Any] | None
    """The stream entry (task 0's)."""
    chunks: list[dict[str, Any]] = field(default_factory=list)
    """This task's chunks, in chunk order."""
    layout: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The stream's owner, before the stream started: every chunk by number."""

    def todo(self) -> deque[dict[str, Any]]:
        """This task's chunks with work left (unread or emitting), in order."""
        return deque(c for c in self.chunks if not chunk_done(c))

    def done(self) -> list[dict[str, Any]]:
        """This task's chunks read and emitted."""
        return [c for c in self.chunks if chunk_done(c)]


def deal(stream: dict[str, Any], chunks: list[dict[str, Any]], task_index: int,
         parallelism: int) -> Share:
    """Task ``task_index``'s share of the restored entries, the same way in
    every task: the stream to task 0; once it started, the chunks are done
    and dropped (its watermarks hold what it needs of them); before, the
    chunks with work left round-robin in chunk order, the done ones by number."""
    share = Share(stream if task_index == 0 else None)
    if stream["hw"] is not None:
        return share
    work = [c for c in chunks if not chunk_done(c)]
    mine = {c["id"] for i, c in enumerate(work) if i % parallelism == task_index}
    share.chunks = [c for c in chunks if c["id"] in mine
                    or (chunk_done(c) and c["id"] % parallelism == task_index)]
    if task_index == 0:
        share.layout = {c["id"]: c for c in chunks}
    return share


def stream_watermarks(layout: dict[int, dict[str, Any]], highs: dict[int, int]
                      ) -> dict[str, list[list[Any]]]:
    """Each table's chunks as ``[upper, hw]`` in key order (the stream's
    filter), from every chunk (``layout``) and its high watermark."""
    out: dict[str, list[list[Any]]] = {}
    for n in sorted(layout):
        c = layout[n]
        out.setdefault(c["table"], []).append([c["upper"], highs[n]])
    return out


def announcement(run: str, attempt: int, chunks: Iterable[dict[str, Any]]) -> str:
    """The log message a task writes when ``chunks`` are done in a completed
    checkpoint of attempt ``attempt`` of run ``run``."""
    return json.dumps({"run": run, "attempt": attempt,
                       "chunks": [[c["id"], c["hw"]] for c in chunks]},
                      separators=(",", ":"))


def read_announcement(content: str, run: str, attempt: int, layout: dict[int, Any]
                      ) -> dict[int, int]:
    """The chunks (number -> high watermark) an announcement read from the
    log names, if it is of this run and attempt; anything else (another
    run's or attempt's, a message of that prefix someone else wrote, or
    damaged) names none."""
    try:
        msg = json.loads(content)
    except ValueError:
        return {}
    if not (isinstance(msg, dict) and msg.get("run") == run and msg.get("attempt") == attempt
            and isinstance(msg.get("chunks"), list) and len(msg["chunks"]) <= _MAX_ANNOUNCED):
        return {}
    out: dict[int, int] = {}
    for item in msg["chunks"]:
        if (isinstance(item, list) and len(item) == 2 and type(item[0]) is int
                and type(item[1]) is int and item[0] in layout and item[1] >= 0):
            out[item[0]] = item[1]
    return out
