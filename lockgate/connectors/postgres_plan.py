"""The PostgreSQL two-phase-commit sink's transaction names and its recovery
planner (pure: no I/O).

A prepared transaction of sink ``uid``, task ``task``, attempt ``attempt`` and
checkpoint ``checkpoint`` of job ``job`` has the global id (gid)::

    lockgate:<job>:<uid>:<task>:<attempt>:<checkpoint>

The uid has only letters, digits, ``_``, ``-`` and ``.`` (the pipeline checks
it), the job id no ``:``; a gid is at most :data:`MAX_GID` bytes (PostgreSQL's
limit), the job id is shortened to fit. Gids come back from checkpoints and
from ``pg_prepared_xacts``, both untrusted: :func:`parse_gid` and
:func:`check_handle` accept this sink's own names and nothing else.

:func:`plan_postgres_recovery` decides, from the gids prepared in the
database and the restored handles, what a restored writer commits and rolls
back; :class:`lockgate.connectors.postgres.PostgresSinkWriter` executes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lockgate.connectors.twophase import Precommitted
from lockgate.errors import CheckpointCorruptError, ConfigurationError

__all__ = ["GID_PREFIX", "MAX_GID", "Gid", "make_gid", "parse_gid", "check_handle",
           "PgTxnHandle", "PostgresRecoveryPlan", "plan_postgres_recovery"]

GID_PREFIX = "lockgate:"
MAX_GID = 199
"""PostgreSQL's gids are at most 199 bytes (``GIDSIZE`` 200 with the NUL)."""

_GID_RE = re.compile(
    r"^lockgate:(?P<job>[^:\x00-\x1f]+):(?P<uid>[A-Za-z0-9_.\-]+):(?P<task>\d{1,9}):"
    r"(?P<attempt>\d{1,9}):(?P<checkpoint>\d{1,18})$")


@dataclass(frozen=True)
class Gid:
    """A parsed global transaction id of this sink."""

    job: str
    uid: str
    task_index: int
    attempt: int
    checkpoint_id: int


def make_gid(job: str, uid: str, task_index: int, attempt: int, checkpoint_id: int) -> str:
    """The gid of a transaction; the job id is cut (from its start: its end
    is the run's random part) so that the gid fits in :data:`MAX_GID` bytes."""
    job = job.replace(":", "-") or "job"
    tail = f":{uid}:{task_index}:{attempt}:{checkpoint_id}"
    room = MAX_GID - len(GID_PREFIX.encode()) - len(tail.encode())
    if room < 8:
        raise ConfigurationError(
            f"PostgreSQL sink uid {uid!r} is too long for a prepared transaction's id "
            f"(at most {MAX_GID} bytes with the job id): give the sink a shorter uid")
    while len(job.encode()) > room:
        job = job[1:]
    gid = f"{GID_PREFIX}{job}{tail}"
    if parse_gid(gid) is None:
        raise ConfigurationError(
            f"PostgreSQL sink: job id {job!r} or uid {uid!r} cannot name a prepared "
            "transaction (control characters?); give the job another name")
    return gid


def parse_gid(gid: Any) -> Gid | None:
    """The parts of one of this sink's gids; ``None`` for anything else."""
    if not isinstance(gid, str) or len(gid.encode()) > MAX_GID:
        return None
    m = _GID_RE.fullmatch(gid)
    if m is None:
        return None
    return Gid(job=m.group("job"), uid=m.group("uid"), task_index=int(m.group("task")),
               attempt=int(m.group("attempt")), checkpoint_id=int(m.group("checkpoint")))


@dataclass(frozen=True, slots=True)
class PgTxnHandle:
    """A prepared transaction (the PostgreSQL sink's two-phase-commit handle)."""

    gid: str
    """Its global id (:func:`make_gid`), for ``COMMIT PREPARED``."""
    xid: int
    """Its transaction id: whether it committed, once no longer prepared."""
    rows: int = 0

    def to_state(self) -> dict[str, Any]:
        return {"gid": self.gid, "xid": self.xid, "rows": self.rows}


def check_handle(handle: dict[str, Any], uid: str) -> PgTxnHandle:
    """A restored pre-commit handle, if it names a transaction of the sink
    ``uid`` and nothing else (untrusted input; a dict whose checkpoint id and
    task index the base checked: :func:`~lockgate.connectors.twophase.decode_precommitted`)."""
    what = f"PostgreSQL sink {uid!r}: a pre-committed transaction's"
    damaged = "the checkpoint or savepoint is damaged or was crafted; it is not restored"
    gid = parse_gid(handle.get("gid"))
    if gid is None or gid.uid != uid:
        raise CheckpointCorruptError(
            f"{what} id is {handle.get('gid')!r:.80}, not one of this sink's prepared "
            f"transactions: {damaged}, and nothing in the database was touched")
    xid = handle.get("xid")
    if type(xid) is not int or not 0 < xid < 2 ** 63:
        raise CheckpointCorruptError(f"{what} xid is {xid!r:.40}: {damaged}")
    rows = handle.get("rows", 0)
    if type(rows) is not int or rows < 0:
        raise CheckpointCorruptError(f"{what} rows is {rows!r:.40}: {damaged}")
    return PgTxnHandle(str(handle["gid"]), xid, rows)


@dataclass
class PostgresRecoveryPlan:
    """What one restored writer does, in this order.

    Attributes:
        to_commit: handles to commit (``COMMIT PREPARED``, idempotent), in
            checkpoint order.
        to_roll_back: gids to ``ROLLBACK PREPARED``: prepared transactions of
            this sink that no restored handle names.
    """

    to_commit: list[Precommitted[PgTxnHandle]] = field(default_factory=list)
    to_roll_back: list[str] = field(default_factory=list)


def plan_postgres_recovery(prepared: list[str], handles: list[Precommitted[PgTxnHandle]],
                           uid: str, task_index: int,
                           parallelism: int) -> PostgresRecoveryPlan:
    """Decide what a restored writer commits and rolls back (pure).

    Args:
        prepared: the gids of ``pg_prepared_xacts`` in the sink's database
            (any names: others' are ignored).
        handles: the restored handles of ALL tasks of this sink (union
            state), decoded (:func:`check_handle`).
        uid, task_index, parallelism: the restored writer's identity.

    Rules:
        * commit the handles with ``task_index % parallelism == task_index``,
          in checkpoint order (a handle no longer prepared was committed
          before: the writer checks that);
        * roll back the prepared transactions of this uid (any job: a job
          resumed by a new driver has a new id) whose task is this task's, or,
          for task 0 only, is ``>= parallelism``, unless a handle names them:
          they were prepared for a checkpoint that never completed, or after
          the restored one;
        * never touch other uids' or other systems' prepared transactions.
    """
    named = {h.handle.gid for h in handles}
    mine = [h for h in handles if h.task_index % parallelism == task_index]
    to_commit = sorted(mine, key=lambda h: h.checkpoint_id)
    to_roll_back: list[str] = []
    for name in sorted(prepared):
        gid = parse_gid(name)
        if gid is None or gid.uid != uid or name in named:
            continue
        if gid.task_index == task_index or (task_index == 0 and gid.task_index >= parallelism):
            to_roll_back.append(name)
    return PostgresRecoveryPlan(to_commit=to_commit, to_roll_back=to_roll_back)
