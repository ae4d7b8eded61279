"""What a checkpoint is made of, as types: :class:`CheckpointMetadata` (the
content of ``_metadata``), :class:`OperatorMetadata` per operator uid and
:class:`StateHandle` per state file. Pure: no I/O.

They become JSON only where they are stored (``to_json``: ``_metadata``, a
task's acknowledgement on the wire) and are read back with ``from_json``,
which treats the data as untrusted (a savepoint copied from elsewhere, a
shared bucket): every field is checked for its type and range, and every file
name is a plain name inside its folder (:mod:`lockgate.untrusted`), before
anything uses it. A bad one is a :class:`CheckpointCorruptError` naming the
field.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
from lockgate.errors import CheckpointCorruptError
from lockgate.state.incremental import IncrementalState
from lockgate.state.keygroups import key_group_range
from lockgate.untrusted import plain_name

FORMAT_VERSION = 1

CHANNEL_STATE_KEY = "#channels"
"""The key of a task's channel state file among the handles of its
acknowledgement (an unaligned checkpoint's in-flight data; no operator uid
starts with ``#``)."""

MAX_INLINE = 1 << 20
"""The most bytes of state a handle may keep inline (in ``_metadata``)."""


@dataclass(frozen=True)
class StateHandle:
    """One operator's state file, written by one task for one checkpoint.

    The file holds a block per key group of keyed state (``key_groups``: key
    group -> offset and length, relative to ``keyed_offset``; ``states``:
    state name -> kind) and then the operator state (``op_state``: offset
    and length), checked by ``size`` and ``crc32`` when it is read.

    ``inline``: the file's bytes themselves, kept in ``_metadata`` instead of
    a file of their own (state no larger than
    ``CheckpointConfig.inline_threshold``, as Flink's memory threshold): no
    file ``file`` exists, and the state is as durable as ``_metadata``."""

    file: str
    size: int
    crc32: int
    keyed_offset: int = 0
    key_groups: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    states: Mapping[str, str] = field(default_factory=dict)
    op_state: tuple[int, int] | None = None
    incremental: IncrementalState | None = None
    """Keyed state as the files of an incremental checkpoint (RocksDB), in
    place of key-group blocks."""
    inline: bytes | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "size": self.size, "crc32": self.crc32,
                               "keyed_offset": self.keyed_offset}
        if self.inline is not None:
            out["inline"] = base64.b64encode(self.inline).decode("ascii")
        if self.incremental is not None:
            out["incremental"] = self.incremental.to_json()
        if self.key_groups:
            out["key_groups"] = {str(kg): [o, n] for kg, (o, n) in self.key_groups.items()}
        if self.states:
            out["states"] = dict(self.states)
        if self.op_state is not None:
            out["op_state"] = list(self.op_state)
        return out

    @classmethod
    def from_json(cls, data: object, what: str,
                  max_parallelism: int | None = None) -> StateHandle:
        """``what`` names the handle in errors; key groups must lie in
        ``[0, max_parallelism)`` when it is given."""
        if not isinstance(data, dict):
            raise CheckpointCorruptError(f"{what} is described by {data!r:.80}: it is corrupt")
        name = plain_name(data.get("file"), what)
        size, crc = (_count(data.get(k), f"{what} has {k}") for k in ("size", "crc32"))
        keyed_offset = _count(data.get("keyed_offset", 0), f"{what} has keyed_offset")
        groups: dict[int, tuple[int, int]] = {}
        raw_groups = data.get("key_groups") or {}
        if not isinstance(raw_groups, dict):
            raise CheckpointCorruptError(f"{what}: key_groups is not a mapping: it is corrupt")
        for kg_text, span in raw_groups.items():
            try:
                kg = int(kg_text)
            except (TypeError, ValueError):
                raise CheckpointCorruptError(
                    f"{what}: key group {kg_text!r:.40} is not a number: it is corrupt") from None
            if kg < 0 or (max_parallelism is not None and kg >= max_parallelism):
                raise CheckpointCorruptError(
                    f"key group {kg} outside [0, {max_parallelism}) in {name}")
            groups[kg] = _span(span, f"{what}: key group {kg}")
        states = data.get("states") or {}
        if not isinstance(states, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in states.items()):
            raise CheckpointCorruptError(f"{what}: states is not a mapping of names to kinds")
        op_state = data.get("op_state")
        incremental = data.get("incremental")
        return cls(name, size, crc, keyed_offset, groups, dict(states),
                   None if op_state is None else _span(op_state, f"{what}: op_state"),
                   None if incremental is None else IncrementalState.from_json(
                       incremental, what, max_parallelism),
                   _inline(data.get("inline"), size, crc, what))


@dataclass(frozen=True)
class OperatorMetadata:
    """One operator uid in a checkpoint: a state handle per subtask (None:
    that task had no state), how its operator state is redistributed, and
    whether every subtask had finished (FLIP-147)."""

    parallelism: int
    operator_state_mode: OperatorStateMode
    subtasks: list[StateHandle | None]
    finished: bool = False
    location: str | None = None
    """Where a sink wrote (secrets masked): a restore whose sink moved is said."""
    channel_state: list[StateHandle | None] | None = None
    """An unaligned checkpoint's in-flight data, on the first operator of each
    chain: per subtask the file of its task's input and output channel state
    (:mod:`lockgate.runtime.channel_state`), None where it had none."""

    @property
    def has_channel_state(self) -> bool:
        return any(h is not None and h.size for h in self.channel_state or ())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "parallelism": self.parallelism,
            "operator_state_mode": str(self.operator_state_mode),
            "subtasks": [h.to_json() if h else None for h in self.subtasks],
            "finished": self.finished,
        }
        if self.location is not None:
            out["location"] = self.location
        if self.channel_state is not None:
            out["channel_state"] = [h.to_json() if h else None for h in self.channel_state]
        return out

    @classmethod
    def from_json(cls, data: object, shown: str, uid: str,
                  max_parallelism: int) -> OperatorMetadata:
        """``shown``: the ``_metadata`` file, as errors name it."""
        what = f"{shown}: operator {uid!r}"
        subtasks = data.get("subtasks") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(subtasks, list):
            raise CheckpointCorruptError(f"{what} has no list of subtasks: it is corrupt")
        try:
            mode = OperatorStateMode(data.get("operator_state_mode", "split"))
        except ValueError:
            raise CheckpointCorruptError(f"{what} has an unknown operator_state_mode "
                                         f"{data.get('operator_state_mode')!r:.40}") from None
        location = data.get("location")
        channels = data.get("channel_state")
        if channels is not None and not (isinstance(channels, list)
                                         and len(channels) == len(subtasks)):
            raise CheckpointCorruptError(f"{what}: channel_state is not a list of one entry "
                                         "per subtask: it is corrupt")
        handles = [None if h is None else StateHandle.from_json(
            h, f"{shown}: the state file of operator {uid!r}, subtask {i},", max_parallelism)
            for i, h in enumerate(subtasks)]
        _check_owners(handles, what, max_parallelism)
        return cls(
            parallelism=_count(data.get("parallelism", len(subtasks)), f"{what} has parallelism"),
            operator_state_mode=mode,
            subtasks=handles,
            finished=bool(data.get("finished", False)),
            location=location if isinstance(location, str) else None,
            channel_state=None if channels is None else [
                None if h is None else StateHandle.from_json(
                    h, f"{shown}: the channel state of operator {uid!r}, subtask {i},")
                for i, h in enumerate(channels)])


def _check_owners(handles: list[StateHandle | None], what: str, max_parallelism: int) -> None:
    """Subtask ``i`` of ``len(handles)`` owned the key groups of
    ``key_group_range(i, len(handles), max_parallelism)`` and wrote no
    other: its canonical blocks lie in that range, and an incremental
    handle's range is that range. So no two handles claim one key group (a
    restore would take it twice, a rescale would copy one over the other)
    and a restore at any parallelism finds each key group where it looks."""
    n = len(handles)
    if n > max_parallelism:
        raise CheckpointCorruptError(f"{what} has {n} subtasks, more than max_parallelism "
                                     f"({max_parallelism}): it is corrupt")
    for i, h in enumerate(handles):
        if h is None:
            continue
        owned = key_group_range(i, n, max_parallelism)
        stray = sorted(kg for kg in h.key_groups if kg not in owned)
        if stray:
            raise CheckpointCorruptError(
                f"{what}: subtask {i} of {n} holds key group {stray[0]}, outside the key "
                f"groups {owned.start}..{owned.stop - 1} it owned: it is corrupt")
        inc = h.incremental
        if inc is not None and inc.key_groups != (owned.start, owned.stop):
            raise CheckpointCorruptError(
                f"{what}: the incremental state of subtask {i} of {n} names key groups "
                f"[{inc.key_groups[0]}, {inc.key_groups[1]}), not the [{owned.start}, "
                f"{owned.stop}) it owned: it is corrupt")


@dataclass(frozen=True)
class Progress:
    """Records read by sources and written by sinks up to a checkpoint."""

    read: int = 0
    written: int = 0


@dataclass(frozen=True)
class CheckpointMetadata:
    """The content of ``chk-<n>/_metadata`` (or a savepoint's): written last,
    atomically; a checkpoint without it does not exist."""

    job_id: str
    checkpoint_id: int
    kind: CheckpointKind
    timestamp: float
    final: bool
    max_parallelism: int
    operators: dict[str, OperatorMetadata]
    progress: Progress = Progress()
    job_name: str | None = None

    def state_files(self) -> Iterator[tuple[str, StateHandle]]:
        """``(operator uid, handle)`` of every state file."""
        for uid, op in self.operators.items():
            for handle in op.subtasks:
                if handle is not None:
                    yield uid, handle

    def channel_state_files(self) -> Iterator[tuple[str, StateHandle]]:
        """``(operator uid, handle)`` of every channel state file (unaligned
        checkpoints: in-flight data)."""
        for uid, op in self.operators.items():
            for handle in op.channel_state or ():
                if handle is not None:
                    yield uid, handle

    @property
    def size(self) -> int:
        return (sum(h.size for _, h in self.state_files())
                + sum(h.size for _, h in self.channel_state_files()))

    @property
    def in_flight_size(self) -> int:
        """Bytes of in-flight data (channel state) in this checkpoint."""
        return sum(h.size for _, h in self.channel_state_files())

    def without(self, uids: set[str]) -> CheckpointMetadata:
        """The same checkpoint without the state of ``uids`` (allow_non_restored_state)."""
        return replace(self, operators={u: o for u, o in self.operators.items()
                                        if u not in uids})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "job_id": self.job_id,
            **({"job_name": self.job_name} if self.job_name is not None else {}),
            "checkpoint_id": self.checkpoint_id,
            "kind": str(self.kind),
            "timestamp": self.timestamp,
            "final": self.final,
            "max_parallelism": self.max_parallelism,
            "operators": {uid: op.to_json() for uid, op in self.operators.items()},
            "progress": {"read": self.progress.read, "written": self.progress.written},
        }

    @classmethod
    def from_json(cls, data: object, shown: str) -> CheckpointMetadata:
        """``shown``: the ``_metadata`` file, as errors name it."""
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise CheckpointCorruptError(
                f"{shown} is not a Lockgate checkpoint of format {FORMAT_VERSION}")
        for key in ("checkpoint_id", "operators", "max_parallelism"):
            if key not in data:
                raise CheckpointCorruptError(f"{shown} lacks the field {key!r}: it is corrupt")
        max_p = _count(data["max_parallelism"], f"{shown} has max_parallelism")
        operators = data["operators"]
        if not isinstance(operators, dict):
            raise CheckpointCorruptError(f"{shown}: 'operators' is not a mapping: it is corrupt")
        progress = data.get("progress") or {}
        try:
            kind = CheckpointKind(data.get("kind", "checkpoint"))
        except ValueError:
            raise CheckpointCorruptError(f"{shown} has an unknown kind "
                                         f"{data.get('kind')!r:.40}") from None
        job_name = data.get("job_name")
        timestamp = data.get("timestamp", 0.0)
        return cls(
            job_id=str(data.get("job_id", "")),
            checkpoint_id=_count(data["checkpoint_id"], f"{shown} has checkpoint_id"),
            kind=kind,
            timestamp=float(timestamp) if isinstance(timestamp, int | float) else 0.0,
            final=bool(data.get("final", False)),
            max_parallelism=max_p,
            operators={str(uid): OperatorMetadata.from_json(op, shown, str(uid), max_p)
                       for uid, op in operators.items()},
            progress=Progress(
                _count(progress.get("read", 0), f"{shown} has progress.read"),
                _count(progress.get("written", 0), f"{shown} has progress.written"))
            if isinstance(progress, dict) else Progress(),
            job_name=job_name if isinstance(job_name, str) else None)


def _inline(value: object, size: int, crc: int, what: str) -> bytes | None:
    """The inline bytes of a handle (base64, untrusted): at most
    :data:`MAX_INLINE`, of the handle's size and CRC-32."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > (MAX_INLINE + 2) // 3 * 4:
        raise CheckpointCorruptError(
            f"{what}: its inline state is not base64 text of at most {MAX_INLINE} bytes: "
            "it is corrupt")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CheckpointCorruptError(
            f"{what}: its inline state is not valid base64: it is corrupt") from None
    if len(data) != size or zlib.crc32(data) != crc:
        raise CheckpointCorruptError(
            f"{what}: its inline state has {len(data)} bytes (CRC-32 {zlib.crc32(data)}), "
            f"the checkpoint recorded {size} (CRC-32 {crc}): it is damaged")
    return data


def _count(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise CheckpointCorruptError(f"{what} {value!r:.40}: it is corrupt")
    return value


def _span(value: object, what: str) -> tuple[int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 2):
        raise CheckpointCorruptError(f"{what} is {value!r:.40}, not [offset, length]: "
                                     "it is corrupt")
    return _count(value[0], f"{what} has offset"), _count(value[1], f"{what} has length")
