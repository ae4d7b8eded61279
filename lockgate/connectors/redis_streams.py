"""``RedisStreamSource``: the entries of Redis streams, replayable from the
entry id in Lockgate's checkpoint.

Each stream is a split; its state is ``{"stream", "last", "end"}``: the id of
the last entry read (the next ``XREAD`` asks for the entries after it) and,
for a bounded source, the last id to read. State is UNION: every task sees
every stream's entry and takes the streams dealt to it (sorted by name,
round-robin), so a restore at any parallelism reads every stream once, from
where the checkpoint left it. Consumer groups are not used: the position
lives in the checkpoint only, so a replay never depends on what Redis
remembers of readers (docs/connectors/redis.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.redis_upsert import import_redis, redact_url, redis_client
from lockgate.errors import CheckpointCorruptError, ConfigurationError

if TYPE_CHECKING:
    import redis

__all__ = ["RedisStreamSource", "RedisStreamReader", "StreamEntry", "parse_id", "deal_streams"]

log = logging.getLogger(__name__)

_ID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})$")


class StreamEntry(NamedTuple):
    """One record: the stream, the entry id and its fields."""

    stream: str
    id: str
    fields: dict[Any, Any]


def parse_id(entry_id: Any, what: str = "stream entry id") -> tuple[int, int]:
    """``"<ms>-<seq>"`` as a pair that orders like Redis orders ids; anything
    else (also from a checkpoint: untrusted) is refused."""
    m = _ID_RE.fullmatch(entry_id) if isinstance(entry_id, str) else None
    if m is None:
        raise CheckpointCorruptError(
            f"Redis stream source: {what} is {entry_id!r:.60}, not an entry id "
            "'<ms>-<seq>': the checkpoint or savepoint is damaged or was crafted")
    return int(m.group(1)), int(m.group(2))


def _check_entry(entry: Any, streams: Sequence[str]) -> dict[str, Any] | None:
    """A restored split, checked; None for a stream the source no longer reads."""
    if not isinstance(entry, dict) or not isinstance(entry.get("stream"), str):
        raise CheckpointCorruptError(
            f"Redis stream source: restored state entry {entry!r:.100} is not a stream "
            "position: restore with the source that wrote the checkpoint")
    parse_id(entry.get("last"), "a restored last id")
    if entry.get("end") is not None:
        parse_id(entry["end"], "a restored end id")
    if entry["stream"] not in streams:
        log.warning("Redis stream source: the checkpoint's stream %r is no longer read",
                    entry["stream"])
        return None
    return {"stream": entry["stream"], "last": entry["last"], "end": entry.get("end")}


def deal_streams(splits: list[dict[str, Any]], task_index: int,
                 parallelism: int) -> list[dict[str, Any]]:
    """The splits task ``task_index`` of ``parallelism`` reads: sorted by
    stream name, round-robin (the same deal in every task)."""
    ordered = sorted(splits, key=lambda s: s["stream"])
    return ordered[task_index::parallelism]


def _last_id(client: redis.Redis, stream: str) -> str:
    """The id of the stream's newest entry, ``"0-0"`` if there is none."""
    newest = client.xrevrange(stream, count=1)
    if not newest:
        return "0-0"
    entry_id = newest[0][0]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


class RedisStreamSource(Source[StreamEntry]):
    """Reads Redis streams from a position in the checkpoint (replayable).

    Args:
        url: ``redis://[user:password@]host:port/db``.
        streams: the stream keys; each is a split.
        start: where a stream without checkpointed position starts: ``"0"``
            (its first entry), ``"$"`` (after its newest entry when the job
            starts, fixed in the driver) or an entry id (after it).
        bounded: read up to each stream's newest entry when the job starts
            (fixed in the driver), then end; otherwise read forever.
        decode: fields as ``str`` (else ``bytes``).
    """

    replayable = True
    operator_state_mode = OperatorStateMode.UNION

    def __init__(self, url: str, streams: Sequence[str] | str, *, start: str = "0",
                 bounded: bool = False, decode: bool = True) -> None:
        names = [streams] if isinstance(streams, str) else list(streams)
        if not names or not all(isinstance(s, str) and s for s in names):
            raise ConfigurationError(f"RedisStreamSource: streams must be stream keys, "
                                     f"got {streams!r}")
        if len(set(names)) != len(names):
            raise ConfigurationError(f"RedisStreamSource: a stream is named twice in {names}")
        if start not in ("0", "$"):
            parse_id(start, "the start id")
        self.url = url
        self.streams = names
        self.start = "0-0" if start == "0" else start
        self.bounded = bounded
        self.decode = decode
        self.starts: dict[str, str] = {}
        """Per stream, the id after which a fresh start reads (fixed in ``prepare``)."""
        self.ends: dict[str, str] = {}
        """Per stream, the last id a bounded source reads (fixed in ``prepare``)."""

    def validate(self) -> None:
        """In the driver: the server answers."""
        redis_client(self.url).close()

    def prepare(self, job_dir: str, uid: str) -> None:
        """Once per job, in the driver: fix ``$`` starts and bounded ends to
        the streams' newest entries now, so every attempt reads the same."""
        client = redis_client(self.url)
        try:
            newest = {s: _last_id(client, s) for s in self.streams}
        finally:
            client.close()
        self.starts = {s: newest[s] if self.start == "$" else self.start for s in self.streams}
        if self.bounded:
            self.ends = dict(newest)

    def splits(self) -> list[dict[str, Any]]:
        """Every stream's split on a fresh start."""
        return [{"stream": s, "last": self.starts.get(s, "0-0" if self.start == "$"
                                                      else self.start),
                 "end": self.ends.get(s, "0-0") if self.bounded else None}
                for s in self.streams]

    def create_reader(self, info: TaskInfo) -> RedisStreamReader:
        return RedisStreamReader(self, info)

    def __repr__(self) -> str:
        return f"RedisStreamSource({redact_url(self.url)!r}, {self.streams!r})"


def _unfinished(split: dict[str, Any]) -> bool:
    return split["end"] is None or parse_id(split["last"]) < parse_id(split["end"])


class RedisStreamReader(SourceReader[StreamEntry]):
    """Reads this task's streams in turn, one ``XREAD`` per poll."""

    def __init__(self, source: RedisStreamSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.splits: list[dict[str, Any]] = []
        self._client: redis.Redis | None = None
        self._turn = 0

    def restore(self, state: list[Any] | None) -> None:
        """Fresh: every stream from its start. Restored: the checkpoint's
        positions, plus the streams it does not know (added since), fresh."""
        splits = self.source.splits()
        if state is not None:
            restored = [s for s in (_check_entry(e, self.source.streams) for e in state) if s]
            known = {s["stream"] for s in restored}
            splits = restored + [s for s in splits if s["stream"] not in known]
        self.splits = deal_streams(splits, self.info.task_index, self.info.parallelism)
        lib = import_redis()
        self._client = lib.Redis.from_url(self.source.url, decode_responses=self.source.decode,
                                          socket_connect_timeout=10, socket_timeout=60)

    def poll(self, max_records: int) -> list[StreamEntry] | None:
        """The entries after the next unfinished stream's position (streams in
        turn, so none starves); ``[]`` if none has any now; ``None`` once a
        bounded source read every stream to its end."""
        assert self._client is not None
        live = [s for s in self.splits if _unfinished(s)]
        if not live:
            return None if self.source.bounded else []
        for i in range(len(live)):
            split = live[(self._turn + i) % len(live)]
            reply: Any = self._client.xread({split["stream"]: split["last"]}, count=max_records)
            if not reply:
                continue
            self._turn = (self._turn + i + 1) % len(live)
            stream = split["stream"]
            entries = reply[0][1]
            if split["end"] is not None:
                end = parse_id(split["end"])
                entries = [e for e in entries if parse_id(_text(e[0])) <= end]
                if not entries:  # the stream grew past the end: this split is done
                    split["last"] = split["end"]
                    continue
            split["last"] = _text(entries[-1][0])
            self.last_split = stream
            return [StreamEntry(stream, _text(entry_id), fields) for entry_id, fields in entries]
        return []

    def unfinished_splits(self) -> list[Any]:
        return [s["stream"] for s in self.splits if _unfinished(s)]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [dict(s) for s in self.splits]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _text(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
