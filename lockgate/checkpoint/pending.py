"""The coordinator's view of one checkpoint, as small objects without I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum

from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
from lockgate.checkpoint.metadata import (
    CHANNEL_STATE_KEY,
    CheckpointMetadata,
    OperatorMetadata,
    Progress,
    StateHandle,
)


class AckResult(Enum):
    SUCCESS = "success"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"
    """The task is not one this checkpoint waits for."""
    DISCARDED = "discarded"
    """The checkpoint was already aborted."""


class CheckpointAbortReason(StrEnum):
    EXPIRED = "expired before every task acknowledged"
    DECLINED = "a task declined it"
    WRITE_FAILED = "its files could not be written"
    TASK_FAILURE = "a task failed"
    ATTEMPT_ENDED = "its attempt ended without a failure"
    """The job was cancelled while the checkpoint was in flight."""
    INPUT_ENDED = "the job's input ended first: the job finishes"
    """A stop's or a rescale's checkpoint in flight when the last source
    task reported the end of its input: the job finishes instead."""


@dataclass
class PendingCheckpoint:
    """Collects the acknowledgements of one checkpoint."""

    checkpoint_id: int
    timestamp: float
    started: float
    """Monotonic clock at trigger time."""
    tasks_to_ack: frozenset[int]
    is_final: bool = False
    savepoint_dir: str | None = None
    """A savepoint: the folder its self-contained copy goes to (else None)."""
    stops: bool = False
    """A stop's savepoint (synchronous, as Flink's): every task holds still
    after its snapshot, and on completion sinks commit and the tasks end."""
    acks: dict[int, dict[str, StateHandle | None]] = field(default_factory=dict)
    """Per task: the state handle of each operator uid it runs."""
    ack_times: dict[int, float] = field(default_factory=dict)
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    finished_tasks: set[int] = field(default_factory=set)
    alignments: dict[int, float] = field(default_factory=dict)
    """Per task: seconds its input channels were blocked to align this checkpoint."""
    """Per task: records read from sources and written to sinks up to the barrier."""
    aborted: CheckpointAbortReason | None = None

    def acknowledge(self, task: int, handles: dict[str, StateHandle | None], now: float,
                    counts: tuple[int, int] = (0, 0), finished: bool = False,
                    alignment: float = 0.0) -> AckResult:
        """``finished``: the task had ended its input (and run ``finish()``)
        before this snapshot."""
        if self.aborted is not None:
            return AckResult.DISCARDED
        if task not in self.tasks_to_ack:
            return AckResult.UNKNOWN
        if task in self.acks:
            return AckResult.DUPLICATE
        self.acks[task] = handles
        self.counts[task] = counts
        if finished:
            self.finished_tasks.add(task)
        self.ack_times[task] = now - self.started
        self.alignments[task] = alignment
        return AckResult.SUCCESS

    @property
    def fully_acknowledged(self) -> bool:
        return self.aborted is None and len(self.acks) == len(self.tasks_to_ack)

    def expired(self, now: float, timeout: float) -> bool:
        return now - self.started > timeout

    @property
    def size(self) -> int:
        """Bytes of the state files acknowledged so far."""
        return sum(h.size for acks in self.acks.values() for h in acks.values() if h)

    @property
    def in_flight_size(self) -> int:
        """Bytes of in-flight data (unaligned checkpoints' channel state) acknowledged so far."""
        return sum(h.size for acks in self.acks.values()
                   if (h := acks.get(CHANNEL_STATE_KEY)) is not None)

    @property
    def kind(self) -> CheckpointKind:
        return (CheckpointKind.SAVEPOINT if self.savepoint_dir is not None
                else CheckpointKind.CHECKPOINT)

    def abort(self, reason: CheckpointAbortReason) -> None:
        self.aborted = reason


def checkpoints_to_discard(completed: list[int], retained: int) -> list[int]:
    """Which completed checkpoints to delete so that the newest ``retained`` stay."""
    ordered = sorted(completed)
    return ordered[:-retained] if len(ordered) > retained else []


def build_metadata(
    job_id: str,
    pending: PendingCheckpoint,
    task_operators: dict[int, tuple[int, int, list[str]]],
    operator_parallelism: dict[str, int],
    operator_modes: dict[str, OperatorStateMode],
    max_parallelism: int,
    baseline: Progress | None = None,
    job_name: str | None = None,
    locations: dict[str, str] | None = None,
) -> CheckpointMetadata:
    """The ``_metadata`` of a fully acknowledged checkpoint.

    ``task_operators`` maps a global task number to ``(vertex, subtask index,
    operator uids)``. Every acknowledgement maps an operator uid to its handle.
    ``baseline`` is the progress recorded in the checkpoint this attempt restored.
    ``job_name`` (the pipeline's name) and ``locations`` (where a sink uid
    writes, secrets masked) let a restore recognise the job and its sinks.
    """
    subtasks: dict[str, list[StateHandle | None]] = {
        uid: [None] * p for uid, p in operator_parallelism.items()}
    finished_subtasks: dict[str, int] = dict.fromkeys(subtasks, 0)
    channels: dict[str, list[StateHandle | None]] = {}
    for task, handles in pending.acks.items():
        _, index, uids = task_operators[task]
        for uid in uids:
            subtasks[uid][index] = handles.get(uid)
            finished_subtasks[uid] += task in pending.finished_tasks
        if handles.get(CHANNEL_STATE_KEY) is not None and uids:
            # an unaligned checkpoint's in-flight data: on the chain's first operator
            channels.setdefault(uids[0], [None] * operator_parallelism[uids[0]])[index] = \
                handles[CHANNEL_STATE_KEY]
    locations = locations or {}
    baseline = baseline or Progress()
    operators = {
        uid: OperatorMetadata(
            parallelism=p, operator_state_mode=operator_modes[uid], subtasks=subtasks[uid],
            # FLIP-147: every subtask had finished: on restore the operator is
            # skipped (reads nothing, runs no end_input/finish again)
            finished=finished_subtasks[uid] == p, location=locations.get(uid),
            channel_state=channels.get(uid))
        for uid, p in operator_parallelism.items()}
    return CheckpointMetadata(
        job_id=job_id, checkpoint_id=pending.checkpoint_id, kind=pending.kind,
        timestamp=pending.timestamp, final=pending.is_final, max_parallelism=max_parallelism,
        operators=operators,
        progress=Progress(baseline.read + sum(c[0] for c in pending.counts.values()),
                          baseline.written + sum(c[1] for c in pending.counts.values())),
        job_name=job_name)
