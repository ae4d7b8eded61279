"""The file sink's part-file names and its recovery planner (pure: no I/O).

A part file of sink ``uid``, task ``task``, attempt ``attempt`` and sequence
number ``seq`` is named, as it moves through a transaction::

    .part-{uid}-{task}-{attempt}-{seq}.{ext}.inprogress   written while records arrive
    .part-{uid}-{task}-{attempt}-{seq}.{ext}.pending      at pre-commit
     part-{uid}-{task}-{attempt}-{seq}.{ext}              at commit (visible)

:func:`plan_file_sink_recovery` decides, from a listing of the folder and the
restored pre-commit handles, what a restored writer commits and deletes;
:class:`lockgate.connectors.filesink.FileSinkWriter` executes the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lockgate.connectors.twophase import Precommitted
from lockgate.errors import CheckpointCorruptError
from lockgate.untrusted import plain_name

__all__ = [
    "PartName",
    "FileSinkRecoveryPlan",
    "final_name",
    "inprogress_name",
    "pending_name",
    "parse_part_name",
    "part_sort_key",
    "check_handle",
    "plan_file_sink_recovery",
]

INPROGRESS_SUFFIX = ".inprogress"
PENDING_SUFFIX = ".pending"

# ------------------------------------------------------------------ names

_PART_RE = re.compile(
    r"^(?P<hidden>\.?)part-(?P<uid>.+)-(?P<task>\d+)-(?P<attempt>\d+)-(?P<seq>\d+)"
    r"\.(?P<ext>[A-Za-z0-9]+)(?P<suffix>\.inprogress|\.pending)?$"
)


@dataclass(frozen=True)
class PartName:
    """A parsed part-file name.

    ``kind`` is ``"inprogress"``, ``"pending"`` or ``"final"``.
    """

    uid: str
    task_index: int
    attempt: int
    seq: int
    ext: str
    kind: str

    @property
    def hidden(self) -> bool:
        """Whether readers skip this file (in-progress or pending)."""
        return self.kind != "final"

    @property
    def final(self) -> str:
        """The visible name this part gets once committed."""
        return final_name(self.uid, self.task_index, self.attempt, self.seq, self.ext)


def final_name(uid: str, task_index: int, attempt: int, seq: int, ext: str) -> str:
    """The visible name of a committed part file."""
    return f"part-{uid}-{task_index}-{attempt}-{seq}.{ext}"


def inprogress_name(final: str) -> str:
    """The hidden name a part file has while records are written into it."""
    return f".{final}{INPROGRESS_SUFFIX}"


def pending_name(final: str) -> str:
    """The hidden name a part file has between pre-commit and commit."""
    return f".{final}{PENDING_SUFFIX}"


def parse_part_name(name: str) -> PartName | None:
    """Parse a part-file name (any of the three kinds); ``None`` if ``name`` is
    not one. A hidden name must carry a suffix and a visible one must not."""
    m = _PART_RE.match(name)
    if m is None:
        return None
    hidden, suffix = m.group("hidden"), m.group("suffix")
    if bool(hidden) != bool(suffix):
        return None
    kind = "final" if not suffix else suffix[1:]
    return PartName(
        uid=m.group("uid"),
        task_index=int(m.group("task")),
        attempt=int(m.group("attempt")),
        seq=int(m.group("seq")),
        ext=m.group("ext"),
        kind=kind,
    )


def part_sort_key(name: str) -> tuple[Any, ...]:
    """Sort key ordering part files by (uid, task, attempt, seq) numerically,
    other names after them by name."""
    p = parse_part_name(name)
    if p is None:
        return (1, name)
    return (0, p.uid, p.task_index, p.attempt, p.seq, p.ext, name)


# ---------------------------------------------------------------- recovery plan


@dataclass
class FileSinkRecoveryPlan:
    """What one writer does at restore.

    Attributes:
        to_commit: ``(pending, final)`` names to commit, in checkpoint order.
        to_delete: hidden files to delete.
        next_seq: first sequence number this task may use for new files (above
            every sequence number of this uid and task index seen in the listing
            or the handles, so names never collide with older output).
    """

    to_commit: list[tuple[str, str]] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    next_seq: int = 0


@dataclass(frozen=True, slots=True)
class FilePartHandle:
    """A pre-committed part file (the file sink's two-phase-commit handle)."""

    pending: str
    """Its hidden pending name in the sink's folder."""
    final: str
    """Its visible name once committed."""
    records: int = 0
    folder: str | None = None
    """The sink's folder when it was written (redacted): a restore into
    another folder names it (older checkpoints do not record it)."""

    def to_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"pending": self.pending, "final": self.final,
                                 "records": self.records}
        if self.folder is not None:
            state["folder"] = self.folder
        return state


def check_handle(handle: dict[str, Any], uid: str) -> FilePartHandle:
    """A restored pre-commit handle of the sink ``uid``, if it names this
    sink's part files and nothing else (untrusted input: :mod:`lockgate.untrusted`;
    a dict whose checkpoint id and task index the base checked:
    :func:`~lockgate.connectors.twophase.decode_precommitted`)."""
    what = f"file sink {uid!r}: a pre-committed part's"
    final = plain_name(handle.get("final"), f"{what} final name")
    pending = plain_name(handle.get("pending"), f"{what} pending name")
    part = parse_part_name(final)
    if part is None or part.kind != "final" or part.uid != uid or pending != pending_name(final):
        raise CheckpointCorruptError(
            f"{what} names are {pending!r} and {final!r}, not this sink's part files: the "
            "checkpoint or savepoint is damaged or was crafted; it is not restored, and "
            "nothing in the sink's folder was touched")
    records, folder = handle.get("records", 0), handle.get("folder")
    if type(records) is not int or records < 0:
        raise CheckpointCorruptError(f"{what} records is {records!r:.40}: the "
                                     "checkpoint or savepoint is damaged or was crafted")
    if folder is not None and not (isinstance(folder, str) and len(folder) <= 4096):
        raise CheckpointCorruptError(f"{what} folder is {folder!r:.80}: the "
                                     "checkpoint or savepoint is damaged or was crafted")
    return FilePartHandle(pending, final, records, folder)


def plan_file_sink_recovery(
    listing: list[str],
    handles: list[Precommitted[FilePartHandle]],
    uid: str,
    task_index: int,
    parallelism: int,
) -> FileSinkRecoveryPlan:
    """Decide what a restored file-sink writer commits and deletes (pure).

    Args:
        listing: the names in the sink folder.
        handles: the restored handles of ALL tasks of this sink (decoded:
            :func:`check_handle`).
        uid, task_index, parallelism: the restored writer's identity.

    Rules:
        * commit the handles with ``task_index % parallelism == task_index``
          unless already committed (final listed, pending not); a handle whose
          two files are both missing is still planned, so that committing it
          reports the lost output;
        * delete the hidden files (in-progress or pending) of this uid whose task
          index is this task's, or, for task 0 only, is ``>= parallelism``, unless
          a handle of any task names them;
        * never touch visible files or files of other uids.
    """
    # Step 1. Index the listing and the names the handles protect.
    present = set(listing)
    named: set[str] = set()
    for h in handles:
        named.add(h.handle.pending)
        named.add(h.handle.final)
    # Step 2. Commit this task's handles, in checkpoint order.
    to_commit: list[tuple[str, str]] = []
    mine = [h for h in handles if h.task_index % parallelism == task_index]
    for h in sorted(mine, key=lambda h: h.checkpoint_id):
        pending, final = h.handle.pending, h.handle.final
        if pending not in present and final in present:
            continue  # already committed
        to_commit.append((pending, final))
    # Step 3. Delete orphans this task owns; find the next free sequence number.
    to_delete: list[str] = []
    next_seq = 0
    for name in sorted(present | named, key=part_sort_key):
        p = parse_part_name(name)
        if p is None or p.uid != uid:
            continue
        if p.task_index == task_index:
            next_seq = max(next_seq, p.seq + 1)
        if not p.hidden or name in named or name not in present:
            continue
        if p.task_index == task_index or (task_index == 0 and p.task_index >= parallelism):
            to_delete.append(name)
    return FileSinkRecoveryPlan(to_commit=to_commit, to_delete=to_delete, next_seq=next_seq)
