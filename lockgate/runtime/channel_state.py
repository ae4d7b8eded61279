"""In-flight data of unaligned checkpoints: a task's channel state.

An unaligned checkpoint (FLIP-76) is taken at a task's first barrier; what
was in flight at that moment belongs to the checkpoint:

* input channel state: the batches a barrier overtook in the mailbox, and
  what arrives on the other channels before their barrier
  (:meth:`InFlightCapture.add_input`), with the watermarks and idleness
  marks among them, in order;
* output channel state: the records the task's output buffered and had not
  sent when the barrier went out ahead of them (:meth:`InFlightCapture.begin`).

The task thread captures them encoded at once (records with the state
serializer: later user code cannot change what was captured; a record it
cannot encode without pickle fails the task as a state value does). The
snapshot writer stores them in ``chk-<n>/<head uid>-<subtask>.channels``
(:func:`write_channel_state`), a :class:`StateHandle` under
``CHANNEL_STATE_KEY`` in the ack, listed in ``_metadata`` on the chain's
first operator (``OperatorMetadata.channel_state``).

On restore (:func:`recover`) the file is read back as untrusted data (size
and CRC, then every field: channel numbers within this task's channels,
element kinds, records a list), then the recovered output state is sent
first on each output channel and the input state is queued in the mailbox
before anything its readers put: replayed into the same channels before new
input. Channel state fits only the parallelism it was taken at: a restore at
another is refused by the driver (``checkpoint.restore.check_channel_state``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from lockgate.checkpoint.metadata import StateHandle
from lockgate.checkpoint.storage import ChecksumWriter, read_state_file, write_state_file
from lockgate.errors import CheckpointCorruptError, LockgateError
from lockgate.fs import Location
from lockgate.protocol import IDLE, Batch, Idle, ProtocolError, StreamElement, Watermark
from lockgate.runtime import wire
from lockgate.runtime.arrow_wire import decode_arrow, encode_arrow
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.mailbox import Mailbox
from lockgate.runtime.operators import OperatorSnapshot, StreamOperator
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.spec import TaskSpec
from lockgate.runtime.wire import Frame
from lockgate.state.serde import StateSerializer

FORMAT = 1
BATCH, WATERMARK, IDLE_MARK, ARROW = 0, 1, 2, 3
"""Element kinds in a channel state file (``ARROW``: record batches as one
Arrow IPC stream, the Arrow path's frames)."""


@dataclass
class InFlight:
    """One unaligned checkpoint as the task captured it at its first barrier:
    operator state, counts as of the barrier, and the channels' in-flight data."""

    checkpoint_id: int
    snaps: list[tuple[StreamOperator, OperatorSnapshot]]
    read: int
    written: int
    finished: bool
    final: bool
    sync_duration: float
    inputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    """Per input channel: ``[kind, value]`` elements in arrival order."""
    outputs: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    """``(output edge, channel, BATCH or ARROW, encoded records)``."""
    size: int = 0
    """Bytes of encoded records captured (in-flight data)."""


class InFlightCapture:
    """The task's capture of the in-flight data of the pending unaligned checkpoint."""

    def __init__(self, serializer: StateSerializer) -> None:
        self.serializer = serializer
        self.current: InFlight | None = None

    def begin(self, snapshot: InFlight, outputs: list[OutputEdgeWriter]) -> None:
        """Start capturing ``snapshot``'s in-flight data with the records the
        outputs have not sent yet."""
        dumps = self.serializer.dumps
        for e, out in enumerate(outputs):
            for ch, arrow, records in out.unsent():
                kind, blob = (ARROW, encode_arrow(records)) if arrow else (BATCH, dumps(records))
                snapshot.outputs.append((e, ch, kind, blob))
                snapshot.size += len(blob)
        self.current = snapshot

    def add_input(self, channel: int, elements: list[StreamElement]) -> None:
        """Elements of ``channel`` that precede its barrier (a no-op for
        anything but batches, watermarks and idleness)."""
        current = self.current
        if current is None:
            return
        out = current.inputs.setdefault(channel, [])
        for element in elements:
            if isinstance(element, Batch):
                records: Any = element.records  # a list, or an Arrow RecordBatch
                if isinstance(records, list):
                    blob = self.serializer.dumps(records)
                    out.append([BATCH, blob])
                else:  # a pyarrow.RecordBatch (the Arrow path): immutable, as IPC
                    blob = encode_arrow([records])
                    out.append([ARROW, blob])
                current.size += len(blob)
            elif isinstance(element, Watermark):
                out.append([WATERMARK, element.timestamp])
            elif isinstance(element, Idle):
                out.append([IDLE_MARK])

    def take(self) -> InFlight | None:
        current, self.current = self.current, None
        return current


def channel_ids(spec: TaskSpec) -> list[tuple[int, int]]:
    """``(input edge, position on it)`` of each of the task's input channels, in order."""
    return [(e, j) for e, edge in enumerate(spec.inputs) for j in range(len(edge))]


def file_name(spec: TaskSpec) -> str:
    return f"{spec.vertex.operators[0].uid}-{spec.task_index}.channels"


def write_channel_state(chk: Location, spec: TaskSpec, snapshot: InFlight,
                        faults: FaultInjector) -> StateHandle | None:
    """Write ``snapshot``'s in-flight data durably (None: there was none).
    The fault point ``channel_state`` is reached halfway through the file."""
    ids = channel_ids(spec)
    inputs = [[*ids[ch], elements] for ch, elements in sorted(snapshot.inputs.items())
              if elements]
    if not inputs and not snapshot.outputs:
        return None  # nothing was in flight: restorable at any parallelism
    outputs = [[e, ch, kind, blob] for e, ch, kind, blob in snapshot.outputs]
    head = msgpack.packb({"format": FORMAT, "checkpoint": snapshot.checkpoint_id,
                          "inputs": inputs}, use_bin_type=True)
    tail = msgpack.packb({"outputs": outputs}, use_bin_type=True)

    def write(out: ChecksumWriter) -> None:
        out.write(len(head).to_bytes(8, "big"))
        out.write(head)
        faults.hit("channel_state")  # the file is half written
        out.write(tail)

    name = file_name(spec)
    size, crc = write_state_file(chk, name, write)
    return StateHandle(name, size, crc)


@dataclass
class Recovered:
    """A task's channel state read back: input elements per channel, output
    batches per ``(edge, channel)``."""

    inputs: dict[int, list[StreamElement]]
    outputs: list[tuple[int, int, Frame, bytes]]
    """``(output edge, channel, frame type, payload)``: frames to send again."""

    def resend(self, outputs: list[OutputEdgeWriter], faults: FaultInjector) -> None:
        """Send the recovered output channel state, first, on each channel."""
        for e, ch, kind, payload in self.outputs:
            faults.hit("replay")
            outputs[e].resend(ch, kind, payload)

    def preload(self, mailbox: Mailbox) -> dict[int, int]:
        """Queue the recovered input channel state ahead of new input; returns
        the number of recovered elements per channel."""
        for ch, elements in self.inputs.items():
            mailbox.preload(ch, elements)
        return {ch: len(elements) for ch, elements in self.inputs.items() if elements}


def recover(spec: TaskSpec, serializer: StateSerializer) -> Recovered | None:
    """This task's channel state in the checkpoint it restores, if any."""
    meta = spec.restore_metadata
    if meta is None or spec.restore_dir is None:
        return None
    op_meta = meta.operators.get(spec.vertex.operators[0].uid)
    if op_meta is None or op_meta.channel_state is None:
        return None
    if op_meta.parallelism != spec.vertex.parallelism and op_meta.has_channel_state:
        raise LockgateError(rescale_message(meta.checkpoint_id))
    if spec.task_index >= len(op_meta.channel_state):
        return None
    handle = op_meta.channel_state[spec.task_index]
    if handle is None:
        return None
    data = read_state_file(spec.restore_dir, handle)
    return parse(data, spec, serializer, f"channel state file {handle.file}")


def rescale_message(checkpoint_id: int) -> str:
    return (f"checkpoint {checkpoint_id} is unaligned: it holds in-flight data of channels "
            "that exist only at the parallelism it was taken at. Restore it at that "
            "parallelism, or rescale through a savepoint (savepoints are always aligned: "
            "take one with `lockgate savepoint` or stop the job with a savepoint, then start "
            "from it at the new parallelism)")


def parse(data: bytes, spec: TaskSpec, serializer: StateSerializer,
          what: str) -> Recovered:
    """Untrusted bytes -> :class:`Recovered`, every field checked."""
    def corrupt(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"{what} {why}: it is corrupt")

    if len(data) < 8:
        raise corrupt("is too short")
    n = int.from_bytes(data[:8], "big")
    if n > len(data) - 8:
        raise corrupt("has a header longer than the file")
    try:
        head = msgpack.unpackb(data[8:8 + n], raw=False)
        tail = msgpack.unpackb(data[8 + n:], raw=False)
    except Exception as e:
        raise corrupt(f"is not msgpack ({type(e).__name__})") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise corrupt(f"is not channel state of format {FORMAT}")
    if not isinstance(tail, dict):
        raise corrupt("has no outputs")
    ids = {cid: ch for ch, cid in enumerate(channel_ids(spec))}
    inputs: dict[int, list[StreamElement]] = {}
    raw_inputs = head.get("inputs")
    if not isinstance(raw_inputs, list):
        raise corrupt("has no list of inputs")
    for entry in raw_inputs:
        if not (isinstance(entry, list) and len(entry) == 3 and _ints(entry[:2])
                and isinstance(entry[2], list)):
            raise corrupt(f"has an input entry {entry!r:.60}")
        ch = ids.get((entry[0], entry[1]))
        if ch is None or ch in inputs:
            raise corrupt(f"names input channel {entry[0]}/{entry[1]}, which this task "
                          f"does not have once")
        inputs[ch] = [_element(e, serializer, corrupt) for e in entry[2]]
    outputs: list[tuple[int, int, Frame, bytes]] = []
    raw_outputs = tail.get("outputs")
    if not isinstance(raw_outputs, list):
        raise corrupt("has no list of outputs")
    for entry in raw_outputs:
        if not (isinstance(entry, list) and len(entry) == 4 and _ints(entry[:2])
                and entry[2] in (BATCH, ARROW) and isinstance(entry[3], bytes)):
            raise corrupt(f"has an output entry {entry!r:.60}")
        edge, ch, kind, blob = entry
        if edge >= len(spec.outputs) or ch >= len(spec.outputs[edge]):
            raise corrupt(f"names output channel {edge}/{ch}, which this task does not have")
        # decoded to be checked, then sent as the frame it was
        if kind == ARROW:
            _arrow(blob, corrupt)
            outputs.append((edge, ch, Frame.ARROW_BATCH, blob))
        else:
            outputs.append((edge, ch, Frame.BATCH,
                            wire.encode_batch(_records(blob, serializer, corrupt))))
    return Recovered(inputs, outputs)


def _ints(values: list[Any]) -> bool:
    return all(type(v) is int and v >= 0 for v in values)


def _records(blob: bytes, serializer: StateSerializer, corrupt: Any) -> list[Any]:
    try:
        records = serializer.loads(blob)
    except CheckpointCorruptError:
        raise
    except Exception as e:
        raise corrupt(f"holds an undecodable batch ({type(e).__name__})") from None
    if not isinstance(records, list):
        raise corrupt("holds a batch that is not a list of records")
    return records


def _arrow(blob: bytes, corrupt: Any) -> Any:
    try:
        return decode_arrow(blob)
    except ProtocolError as e:
        raise corrupt(f"holds an undecodable Arrow batch ({e})") from None


def _element(raw: object, serializer: StateSerializer, corrupt: Any) -> StreamElement:
    if isinstance(raw, list) and raw:
        kind = raw[0]
        if kind == BATCH and len(raw) == 2 and isinstance(raw[1], bytes):
            return Batch(_records(raw[1], serializer, corrupt))
        if kind == ARROW and len(raw) == 2 and isinstance(raw[1], bytes):
            return Batch(_arrow(raw[1], corrupt))
        if (kind == WATERMARK and len(raw) == 2 and isinstance(raw[1], int | float)
                and not isinstance(raw[1], bool) and raw[1] == raw[1]):
            return Watermark(raw[1])
        if kind == IDLE_MARK and len(raw) == 1:
            return IDLE
    raise corrupt(f"has an element {raw!r:.60}")
