"""Which parts of a checkpoint a task restores. Pure: no I/O.

Keyed state: every key group in the task's range, from whichever old subtask
wrote it. Operator state (``OperatorStateMode.SPLIT``): with unchanged
parallelism each task gets its own entries back; otherwise all entries are
dealt round-robin. (``UNION``): every task gets every entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.checkpoint.metadata import CheckpointMetadata, OperatorMetadata, StateHandle
from lockgate.errors import CheckpointCorruptError, LockgateError
from lockgate.state.keygroups import key_group_range


@dataclass
class KeyedRestore:
    """Blocks to read: (state file handle, offset, length) per key group."""

    blocks: list[tuple[StateHandle, int, int]] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)


def plan_keyed_restore(
    op_meta: OperatorMetadata, task_index: int, parallelism: int, max_parallelism: int
) -> KeyedRestore:
    wanted = key_group_range(task_index, parallelism, max_parallelism)
    plan = KeyedRestore()
    for handle in op_meta.subtasks:
        if not handle or not handle.key_groups:
            continue
        for name, kind in handle.states.items():
            plan.states.setdefault(name, kind)
        for kg, (offset, length) in handle.key_groups.items():
            if not 0 <= kg < max_parallelism:  # (checked when read: a changed max_parallelism)
                raise CheckpointCorruptError(
                    f"key group {kg} outside [0, {max_parallelism}) in {handle.file}"
                )
            if kg in wanted:
                plan.blocks.append((handle, handle.keyed_offset + offset, length))
    plan.blocks.sort(key=lambda b: (b[0].file, b[1]))
    return plan


def distribute_operator_state(
    per_subtask: list[list[Any]], mode: OperatorStateMode | str, task_index: int,
    parallelism: int
) -> list[Any]:
    """The operator-state entries task ``task_index`` of ``parallelism`` receives
    (``mode`` as read back from ``_metadata``: a string)."""
    if mode == OperatorStateMode.UNION:
        return [e for entries in per_subtask for e in entries]
    if len(per_subtask) == parallelism:
        return list(per_subtask[task_index])
    flat = [e for entries in per_subtask for e in entries]
    return flat[task_index::parallelism]


def check_channel_state(meta: CheckpointMetadata, parallelism: dict[str, int],
                        shown: str, heads: set[str] | None = None) -> None:
    """An unaligned checkpoint's in-flight data fits only the job graph and
    parallelism it was taken at: refuse a restore at another parallelism, or
    where an operator that holds in-flight data no longer starts a chain
    (``heads``: the first operator uid of every chain of the job), naming the
    fix (a savepoint, which is always aligned). ``parallelism``: of each
    operator uid of the job."""
    holders = sorted(uid for uid, op in meta.operators.items() if op.has_channel_state)
    if not holders:
        return
    changed = sorted(uid for uid, op in meta.operators.items()
                     if uid in parallelism and parallelism[uid] != op.parallelism)
    moved = sorted(uid for uid in holders if heads is not None and uid not in heads)
    if changed or moved:
        what = (f"operator(s) {changed} now run at another parallelism" if changed else
                f"operator(s) {moved} no longer start a chain of tasks")
        raise LockgateError(
            f"{shown} is an unaligned checkpoint: it holds in-flight data of channels that "
            f"exist only in the job graph and at the parallelism it was taken at, and {what}. "
            "Restore it unchanged, or rescale through a savepoint (savepoints are always "
            "aligned): start the job from this checkpoint as it was, take a savepoint "
            "(`lockgate savepoint`, or stop with one), then start from the savepoint")
