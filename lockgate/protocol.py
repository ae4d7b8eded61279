"""Every message between Lockgate's processes: one frozen type each.

Two families travel on the same framing (:mod:`lockgate.runtime.wire`):

* **stream elements**, in band on a data channel from one task to the next,
  in order: :class:`Batch`, :class:`Barrier`, :class:`CancelBarrier`,
  :class:`Watermark`, :class:`Idle`, :class:`EndOfData`,
  :class:`EndOfPartition` (and :class:`ChannelLost`, which a task's own
  reader thread puts in its mailbox when a connection breaks);
* **control messages** between the driver and a task: from the driver
  :class:`Start`, :class:`TriggerCheckpoint`, :class:`NotifyComplete`,
  :class:`NotifyAborted`, :class:`Finish`, :class:`Drain`, :class:`Cancel`
  (and :class:`ControlLost`, a task's own note that the driver went away);
  from a task :class:`Register`, :class:`Running`, :class:`Ack`,
  :class:`Decline`, :class:`InputEnded`, :class:`Finished`, :class:`Failed`,
  :class:`TaskMetrics`.

A receiver handles them with one ``match``. Control messages are encoded here
(:func:`encode_control`, :func:`decode_control`) as a msgpack list
``[tag, field, ...]``; decoding checks the tag, the number of fields and
each field's type, so a malformed message is a :class:`ProtocolError`, never
a ``KeyError`` deep in the driver. Nothing here is pickled.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, TypeAlias

import msgpack

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.checkpoint.metadata import StateHandle
from lockgate.errors import CheckpointCorruptError, LockgateError

Address: TypeAlias = tuple[str, int]
StateHandles: TypeAlias = dict[str, StateHandle | None]
"""Per operator uid, the handle of its state file in one checkpoint, or None
for an operator without state (on the wire as in ``_metadata``)."""


class ProtocolError(LockgateError, ValueError):
    """A message that does not follow the protocol (unknown type, wrong fields)."""


# --------------------------------------------------------------- stream elements
@dataclass(frozen=True, slots=True)
class Batch:
    """Records, many at once: the unit that moves on a channel."""

    records: list[Any]


@dataclass(frozen=True, slots=True)
class Barrier:
    """Splits a channel into before and after checkpoint ``checkpoint_id``."""

    checkpoint_id: int
    kind: BarrierKind = BarrierKind.CHECKPOINT
    timestamp: float = 0.0


@dataclass(frozen=True, slots=True)
class CancelBarrier:
    """An upstream task gave checkpoint ``checkpoint_id`` up: so does this one."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Watermark:
    """No record with an event time at or below ``timestamp`` follows (ms)."""

    timestamp: float


@dataclass(frozen=True, slots=True)
class Idle:
    """The upstream task has no input for a while: leave it out of the
    watermark until it sends one again."""


@dataclass(frozen=True, slots=True)
class EndOfData:
    """The upstream task's input ended; ``drained``: by ``stop --drain``
    (nothing is finished: a job resumed from the savepoint reads on)."""

    drained: bool


@dataclass(frozen=True, slots=True)
class EndOfPartition:
    """The upstream task ends; nothing follows on this channel."""


@dataclass(frozen=True, slots=True)
class ChannelLost:
    """Task-local: the connection of an input channel broke."""

    reason: str


StreamElement: TypeAlias = (Batch | Barrier | CancelBarrier | Watermark | Idle | EndOfData
                            | EndOfPartition | ChannelLost)
IDLE = Idle()
END_OF_PARTITION = EndOfPartition()


# -------------------------------------------------------------- control messages
@dataclass(frozen=True, slots=True)
class ControlMessage:
    """Base of the messages between the driver and a task."""

    tag: ClassVar[str] = ""


# driver -> task
@dataclass(frozen=True, slots=True)
class Start(ControlMessage):
    """Every task of the attempt registered: here is where each one listens."""

    tag: ClassVar[str] = "start"
    peers: dict[int, Address]


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint(ControlMessage):
    """To a source task: snapshot and send ``Barrier(checkpoint_id, kind)``;
    ``kind``: :class:`BarrierKind`."""

    tag: ClassVar[str] = "trigger"
    checkpoint_id: int
    kind: BarrierKind = BarrierKind.CHECKPOINT


@dataclass(frozen=True, slots=True)
class NotifyComplete(ControlMessage):
    """Checkpoint ``checkpoint_id`` exists (its ``_metadata`` is written): commit."""

    tag: ClassVar[str] = "complete"
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class NotifyAborted(ControlMessage):
    tag: ClassVar[str] = "abort"
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Finish(ControlMessage):
    """The final checkpoint completed: the task may end."""

    tag: ClassVar[str] = "finish"


@dataclass(frozen=True, slots=True)
class Drain(ControlMessage):
    """To a source task (``stop --drain``): end the input now, as if exhausted."""

    tag: ClassVar[str] = "drain"


@dataclass(frozen=True, slots=True)
class Cancel(ControlMessage):
    tag: ClassVar[str] = "cancel"


@dataclass(frozen=True, slots=True)
class ControlLost(ControlMessage):
    """Task-local: the connection to the driver broke."""

    tag: ClassVar[str] = "lost"


# task -> driver
@dataclass(frozen=True, slots=True)
class Register(ControlMessage):
    """A task is up: its data listener (port 0: it has no inputs) and pid."""

    tag: ClassVar[str] = "register"
    host: str
    port: int
    pid: int


@dataclass(frozen=True, slots=True)
class Running(ControlMessage):
    """Every channel of the task is connected; it processes. ``steps``: when
    each of its start-up steps happened (wall clock, :mod:`lockgate.runtime.steps`);
    ``local_restores``: per keyed operator that looked for a local copy of
    its state as it restored (local recovery), ``[operator uid, checkpoint
    id, used, reason it was not]``."""

    tag: ClassVar[str] = "running"
    steps: dict[str, float] = field(default_factory=dict)
    local_restores: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.steps) > 16 or not all(
                isinstance(k, str) and len(k) <= 32 and isinstance(v, int | float)
                and not isinstance(v, bool) and 0 <= v < 1e11 for k, v in self.steps.items()):
            raise ProtocolError("running: steps must map at most 16 names to times")
        if len(self.local_restores) > 256 or not all(
                isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
                and len(r[0]) <= 1000 and type(r[1]) is int and r[1] >= 0
                and type(r[2]) is bool and isinstance(r[3], str) and len(r[3]) <= 1000
                for r in self.local_restores):
            raise ProtocolError("running: local_restores must be at most 256 "
                                "[uid, checkpoint, used, reason] lists")


@dataclass(frozen=True, slots=True)
class Ack(ControlMessage):
    """The task's state for ``checkpoint_id`` is durable (``handles``), with its
    record counts, whether it finished (FLIP-147) and its alignment time."""

    tag: ClassVar[str] = "ack"
    checkpoint_id: int
    handles: StateHandles
    read: int
    written: int
    finished: bool
    alignment: float
    sync_duration: float = 0.0
    """Seconds of the snapshot's synchronous part (the task thread)."""
    async_duration: float = 0.0
    """Seconds of its asynchronous part (writing the files), to the ack."""


@dataclass(frozen=True, slots=True)
class Decline(ControlMessage):
    """The task cannot take ``checkpoint_id``; ``error_type`` names the
    exception class when an error caused it."""

    tag: ClassVar[str] = "decline"
    checkpoint_id: int
    reason: str
    error_type: str | None = None


@dataclass(frozen=True, slots=True)
class InputEnded(ControlMessage):
    """The task's input ended (bounded, or drained) and it sent ``EndOfData``."""

    tag: ClassVar[str] = "end_of_data"
    read: int
    written: int


@dataclass(frozen=True, slots=True)
class Finished(ControlMessage):
    tag: ClassVar[str] = "finished"
    read: int
    written: int


@dataclass(frozen=True, slots=True)
class Failed(ControlMessage):
    """The task fails: the error, its class name, where in the input a user
    function failed (or None), the traceback to show, and the class name of
    the error's cause (a user function's own error, or None)."""

    tag: ClassVar[str] = "failed"
    error: str
    error_type: str
    where: str | None
    traceback: str
    cause_type: str | None = None


@dataclass(frozen=True, slots=True)
class TaskMetrics(ControlMessage):
    """A task's figures, sent about once a second (:mod:`lockgate.runtime.metrics`):
    records in and out of its chain since the attempt started; seconds busy,
    backpressured (blocked sending) and idle (waiting for input) since then;
    the fill of its input queues (0..1); its current watermark (ms; None
    before the first); the number of keys in its keyed state; its source's
    backlog, the records it could read now and has not (None: no source, or
    the source cannot tell)."""

    tag: ClassVar[str] = "metrics"
    records_in: int
    records_out: int
    busy: float
    backpressured: float
    idle: float
    queue_fill: float
    watermark: float | None
    state_keys: int
    backlog: int | None = None

    def __post_init__(self) -> None:
        for name in ("records_in", "records_out", "state_keys"):
            if getattr(self, name) < 0:
                raise ProtocolError(f"metrics: {name} must be >= 0")
        if self.backlog is not None and self.backlog < 0:
            raise ProtocolError(f"metrics: backlog must be >= 0, got {self.backlog!r}")
        for name in ("busy", "backpressured", "idle"):
            value = getattr(self, name)
            if not 0.0 <= value < 1e12:
                raise ProtocolError(f"metrics: {name} must be seconds >= 0, got {value!r}")
        if not 0.0 <= self.queue_fill <= 1.0:
            raise ProtocolError(f"metrics: queue_fill must be in [0, 1], got {self.queue_fill!r}")
        if self.watermark is not None and self.watermark != self.watermark:
            raise ProtocolError("metrics: watermark is NaN")


# a connection's first message, after the HMAC challenge
@dataclass(frozen=True, slots=True)
class Hello(ControlMessage):
    """Who connects: ``role`` ``task`` (control), ``data`` (a channel from task
    ``task``), ``lease`` (a Spark task's lease, with its ``pid`` and ``host``)
    or ``host`` (a Spark task slot of the job's barrier stage: ``attempt`` is
    the stage's generation, ``task`` the slot), for which job and attempt
    (connections of another attempt are refused)."""

    tag: ClassVar[str] = "hello"
    role: str
    job: str
    attempt: int
    task: int
    pid: int = 0
    host: str = ""


# a Spark task's lease (cluster.spark.launcher)
@dataclass(frozen=True, slots=True)
class LeaseGranted(ControlMessage):
    tag: ClassVar[str] = "lease_granted"


@dataclass(frozen=True, slots=True)
class LeaseRefused(ControlMessage):
    tag: ClassVar[str] = "lease_refused"


@dataclass(frozen=True, slots=True)
class Finishing(ControlMessage):
    """The task is about to say ``finished`` and end by itself (answered with
    :class:`FinishingSeen`)."""

    tag: ClassVar[str] = "finishing"


@dataclass(frozen=True, slots=True)
class FinishingSeen(ControlMessage):
    tag: ClassVar[str] = "finishing_seen"


@dataclass(frozen=True, slots=True)
class Exited(ControlMessage):
    """The task's code ended with ``code`` (0: normally)."""

    tag: ClassVar[str] = "exited"
    code: int


# the Spark launcher's task hosts (lockgate.cluster.spark.stage, spark.host)
@dataclass(frozen=True, slots=True)
class RunTask(ControlMessage):
    """To a host: fork a child that runs the task in ``payload`` (the
    launcher's pickled task job) for attempt ``attempt``."""

    tag: ClassVar[str] = "run_task"
    attempt: int
    payload: bytes

    def __post_init__(self) -> None:
        if self.attempt < 0:
            raise ProtocolError(f"run_task: attempt must be >= 0, got {self.attempt}")


@dataclass(frozen=True, slots=True)
class KillTask(ControlMessage):
    """To a host: SIGKILL the task child it runs, if any."""

    tag: ClassVar[str] = "kill_task"


@dataclass(frozen=True, slots=True)
class Release(ControlMessage):
    """To a host: end the child, if any, and return the Spark task. ``job_over``:
    the job ended (the host deletes the job's local copies on its machine);
    False: the job goes on in a stage of another size (a rescale)."""

    tag: ClassVar[str] = "release"
    job_over: bool = True


@dataclass(frozen=True, slots=True)
class TaskEnded(ControlMessage):
    """From a host: the child of attempt ``attempt`` ended with ``code`` (its
    exit status; negative: the signal that killed it)."""

    tag: ClassVar[str] = "task_ended"
    attempt: int
    code: int


ToTask: TypeAlias = (Start | TriggerCheckpoint | NotifyComplete | NotifyAborted | Finish | Drain
                     | Cancel | ControlLost)
ToDriver: TypeAlias = (Register | Running | Ack | Decline | InputEnded | Finished | Failed
                       | TaskMetrics)

_MESSAGES: dict[str, type[ControlMessage]] = {
    cls.tag: cls for cls in (Start, TriggerCheckpoint, NotifyComplete, NotifyAborted, Finish,
                             Drain, Cancel, Register, Running, Ack, Decline, InputEnded,
                             Finished, Failed, TaskMetrics, Hello, LeaseGranted,
                             LeaseRefused, Finishing, FinishingSeen, Exited, RunTask,
                             KillTask, Release, TaskEnded)
}


def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The Python types a decoded field of type ``hint`` may have (an enum's
    field arrives as its value, checked and converted by :func:`decode_control`)."""
    if hint is Any:
        return (object,)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return (str,)
    if hint is float:
        return (int, float)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return tuple(t for arg in typing.get_args(hint) for t in _runtime_types(arg))
    if hint is type(None):
        return (type(None),)
    return (origin or hint,)


_HINTS: dict[type[ControlMessage], list[tuple[str, Any]]] = {
    cls: [(f.name, hints[f.name]) for f in fields(cls)]
    for cls in _MESSAGES.values() for hints in [typing.get_type_hints(cls)]
}
"""Each message's fields and their types (the annotations evaluated once per class)."""
_SCHEMAS: dict[type[ControlMessage], list[tuple[str, tuple[type, ...]]]] = {
    cls: [(name, _runtime_types(hint)) for name, hint in hints]
    for cls, hints in _HINTS.items()
}
_ENUMS: dict[type[ControlMessage], list[tuple[int, type[StrEnum]]]] = {
    cls: [(i, hint) for i, (_, hint) in enumerate(hints)
          if isinstance(hint, type) and issubclass(hint, StrEnum)]
    for cls, hints in _HINTS.items()
}


def encode_control(message: ControlMessage) -> bytes:
    """``[tag, field, ...]`` as msgpack."""
    values = [getattr(message, name) for name, _ in _SCHEMAS[type(message)]]
    if isinstance(message, Ack):
        values[1] = {uid: h.to_json() if h else None for uid, h in message.handles.items()}
    payload: bytes = msgpack.packb([message.tag, *values], use_bin_type=True)
    return payload


def decode_control(payload: bytes) -> ControlMessage:
    """The message in ``payload``; :class:`ProtocolError` unless it is one of
    the protocol's, with the right number and types of fields."""
    try:
        data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:
        raise ProtocolError(f"undecodable control message: {type(e).__name__}: {e}") from None
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ProtocolError("a control message must be a list starting with its type")
    cls = _MESSAGES.get(data[0])
    if cls is None:
        raise ProtocolError(f"unknown control message type {data[0][:40]!r}")
    schema = _SCHEMAS[cls]
    values = data[1:]
    if len(values) != len(schema):
        raise ProtocolError(f"{data[0]}: {len(values)} fields, expected {len(schema)}")
    for (name, allowed), value in zip(schema, values, strict=True):
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed
                                              and object not in allowed):
            raise ProtocolError(f"{data[0]}: field {name} has type {type(value).__name__}")
    if cls is Start:
        peers = values[0]
        if not all(isinstance(t, int) and isinstance(a, list) and len(a) == 2
                   and isinstance(a[0], str) and isinstance(a[1], int)
                   for t, a in peers.items()):
            raise ProtocolError("start: peers must map task numbers to [host, port]")
        return Start({t: (a[0], a[1]) for t, a in peers.items()})
    if cls is Ack:
        try:
            values[1] = {str(uid): None if h is None else StateHandle.from_json(
                h, f"the state file of {uid!r:.40}") for uid, h in values[1].items()}
        except CheckpointCorruptError as e:
            raise ProtocolError(f"ack: {e}") from None
    for i, enum in _ENUMS[cls]:
        try:
            values[i] = enum(values[i])
        except ValueError:
            raise ProtocolError(
                f"{data[0]}: field {schema[i][0]} is {values[i][:40]!r}, not one of "
                f"{', '.join(m.value for m in enum)}") from None
    return cls(*values)
