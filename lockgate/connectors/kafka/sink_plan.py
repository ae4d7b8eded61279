"""The Kafka sink's names and recovery plan — pure, no client.

A sink task's transactional id (also its marker group) is
``<prefix>-<job>-<uid>-<task>``. Its operator state holds *handles* (one per
pre-committed checkpoint: :class:`KafkaTxnHandle`, ``{"tid", "writer", "seq",
"keys", "values"}``) and one *owner* entry (:class:`KafkaOwner`,
``{"owner": tid}``), each with the two-phase-commit base's ``checkpoint_id``
and ``task_index``. Everything read back from a checkpoint
is checked here before the sink touches a transaction (untrusted input: a
crafted checkpoint must not make the sink redo another sink's records or
fence another application's producer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lockgate.connectors.twophase import Precommitted
from lockgate.errors import CheckpointCorruptError

__all__ = ["transactional_id", "check_entry", "RecoveryPlan", "plan_recovery", "committed",
           "KafkaTxnHandle", "KafkaOwner", "KafkaEntry", "Pair", "OWNER"]

OWNER = "owner"
"""The key of an owner entry."""

_NAME = re.compile(r"[A-Za-z0-9._-]+")


def transactional_id(prefix: str, job_id: str, uid: str, task_index: int) -> str:
    """The transactional id (and marker group) of sink task ``task_index``."""
    return f"{prefix}-{job_id}-{uid}-{task_index}"


def _own_tid(value: Any, prefix: str, uid: str, entry: dict[str, Any]) -> str:
    """``value`` if it is a transactional id this sink (prefix and uid) gave
    to the task that wrote ``entry``."""
    task = entry.get("task_index")
    ok = (isinstance(value, str) and len(value) <= 249 and type(task) is int and task >= 0
          and value.startswith(f"{prefix}-") and value.endswith(f"-{uid}-{task}")
          and _NAME.fullmatch(value[len(prefix) + 1:-len(f"-{uid}-{task}")] or "") is not None)
    if not ok:
        raise CheckpointCorruptError(
            f"Kafka sink {uid!r}: restored state entry names the transactional id {value!r}, "
            f"not one of this sink's ('{prefix}-<job>-{uid}-<task>'); restore with the sink that "
            "wrote the checkpoint (same uid and transactional_id_prefix)")
    assert isinstance(value, str)
    return value


Pair = tuple[bytes | None, bytes | None]
"""A record as sent: key and value bytes (either may be None)."""


@dataclass(frozen=True, slots=True)
class KafkaTxnHandle:
    """A pre-committed checkpoint's transaction of one task: its
    transactional id, the writer and sequence number that name the live
    one, and its records (keys and values, two lists of one length) to redo
    it with."""

    tid: str
    writer: str
    seq: int
    keys: list[bytes | None]
    values: list[bytes | None]

    @property
    def records(self) -> list[Pair]:
        return list(zip(self.keys, self.values, strict=True))

    def to_state(self) -> dict[str, Any]:
        # the keys and the values as two lists of bytes: msgpack packs them
        # natively (a list of tuples would take a callback per record)
        return {"tid": self.tid, "writer": self.writer, "seq": self.seq,
                "keys": self.keys, "values": self.values}


@dataclass(frozen=True, slots=True)
class KafkaOwner:
    """An owner entry: the transactional id the task that wrote it used (the
    task that takes it over fences it, even when no handle names it)."""

    tid: str

    def to_state(self) -> dict[str, Any]:
        return {OWNER: self.tid}


KafkaEntry = KafkaTxnHandle | KafkaOwner
"""What the Kafka sink's state holds: transactions and owner entries."""


def _records(entry: dict[str, Any], uid: str) -> tuple[list[bytes | None], list[bytes | None]]:
    """A handle's records as keys and values: two lists of bytes (or None)
    of one length; or, as older checkpoints hold them, ``records``:
    [key, value] pairs."""
    if "records" not in entry:
        keys, values = entry.get("keys"), entry.get("values")
        if not (type(keys) is list and type(values) is list and len(keys) == len(values)
                and all(x is None or type(x) is bytes for x in keys)
                and all(x is None or type(x) is bytes for x in values)):
            raise CheckpointCorruptError(
                f"Kafka sink {uid!r}: a restored transaction's keys and values are not two "
                "lists of bytes of one length; the checkpoint was not written by this sink")
        return keys, values
    value = entry["records"]
    ok = isinstance(value, list | tuple) and all(
        isinstance(r, list | tuple) and len(r) == 2
        and all(x is None or isinstance(x, bytes) for x in r) for r in value)
    if not ok:
        raise CheckpointCorruptError(
            f"Kafka sink {uid!r}: a restored transaction's records are not [key, value] "
            "pairs of bytes; the checkpoint was not written by this sink")
    return [k for k, _ in value], [v for _, v in value]


def check_entry(entry: dict[str, Any], prefix: str, uid: str) -> KafkaEntry:
    """A restored entry as a :class:`KafkaTxnHandle` or a :class:`KafkaOwner`;
    ``CheckpointCorruptError`` for anything else (its checkpoint id and task
    index are the base's to check: :func:`~lockgate.connectors.twophase.decode_precommitted`)."""
    if OWNER in entry:
        return KafkaOwner(_own_tid(entry[OWNER], prefix, uid, entry))
    writer, seq = entry.get("writer"), entry.get("seq")
    if not isinstance(writer, str) or type(seq) is not int:
        raise CheckpointCorruptError(
            f"Kafka sink {uid!r}: restored state entry is not a transaction of this sink")
    keys, values = _records(entry, uid)
    return KafkaTxnHandle(_own_tid(entry.get("tid"), prefix, uid, entry), writer, seq,
                          keys, values)


def committed(marker: int | None, entry: Precommitted[KafkaEntry]) -> bool:
    """Whether ``entry``'s transaction committed, from the marker group's
    committed offset (``None``: the group never committed): transactions of
    one id commit in checkpoint order, each with its checkpoint id as marker."""
    return marker is not None and marker >= entry.checkpoint_id


@dataclass(frozen=True)
class RecoveryPlan:
    """What one sink task does with a restored checkpoint's entries."""

    handles: list[Precommitted[KafkaTxnHandle]]
    """The transactions to commit (or find committed), in checkpoint order."""
    fence: list[str]
    """Transactional ids of old tasks to initialize (aborting what they left
    open) that no handle and not the task itself uses."""


def plan_recovery(entries: list[Precommitted[KafkaEntry]], task_index: int, parallelism: int,
                  own_tid: str) -> RecoveryPlan:
    """The handles and old ids task ``task_index`` of ``parallelism`` takes
    over: those written by a task ``t`` with ``t % parallelism ==
    task_index`` (every entry is seen by every task: UNION state; each
    decoded by :func:`check_entry`)."""
    handles: list[Precommitted[KafkaTxnHandle]] = []
    owners: set[str] = set()
    for entry in entries:
        if entry.task_index % parallelism != task_index:
            continue
        h = entry.handle
        if isinstance(h, KafkaTxnHandle):
            handles.append(Precommitted(entry.checkpoint_id, entry.task_index, h))
        owners.add(h.tid)
    handles.sort(key=lambda e: (e.checkpoint_id, e.handle.seq))
    used = {e.handle.tid for e in handles} | {own_tid}
    return RecoveryPlan(handles, sorted(owners - used))
