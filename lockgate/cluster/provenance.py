"""Where a checkpoint or savepoint came from: the job that took it and where
its sinks wrote (``_metadata``'s ``job_name`` and ``operators[uid].location``),
so that a restore into another job, or a sink that moved, is said plainly."""

from __future__ import annotations

import logging

from lockgate import fs
from lockgate.api.plan import OperatorKind
from lockgate.checkpoint.metadata import CheckpointMetadata
from lockgate.graph.jobgraph import JobGraph

log = logging.getLogger("lockgate.driver")


def sink_locations(graph: JobGraph) -> dict[str, str]:
    """Where each sink uid of the job writes (a path or URL, secrets masked),
    for the sinks that say (``path``)."""
    return {op.uid: fs.redact(op.fn.path) for op in graph.operators()
            if op.kind == OperatorKind.SINK and isinstance(getattr(op.fn, "path", None), str)}


def other_job(meta: CheckpointMetadata | None, job_name: str | None) -> str:
    """`` It is a savepoint of job 'sums' (sums-1a2b3c4d); this job is
    'totals'.`` when ``_metadata`` (``meta``) is another job's, else ``""``."""
    name = meta.job_name if meta else None
    if meta is None or name is None or not job_name or name == job_name:
        return ""
    return (f" It is a {meta.kind} of job {name!r} ({meta.job_id}); "
            f"this job is {job_name!r}.")


def check_sink_locations(meta: CheckpointMetadata, graph: JobGraph, chk: str,
                         job_name: str | None) -> None:
    """Say so when a sink writes elsewhere than the one that took the
    checkpoint (a folder moved with its files is fine; otherwise its
    pre-committed output is in the old one and the restore refuses, the sink's
    ``recover`` raising :class:`SavepointMismatchError`): name both
    locations, both jobs, and how to go on."""
    kind = meta.kind
    for uid, location in sink_locations(graph).items():
        op = meta.operators.get(uid)
        old = op.location if op else None
        if old is None or old == location:
            continue
        log.warning(
            "sink %r wrote to %s when %s %s was taken, and now writes to %s.%s Unless the "
            "folder was moved there with its files, the restore fails: give the sink its old "
            "location, or a new uid and allow_non_restored_state=True "
            "(--allow-non-restored-state) to start it afresh", uid, old, kind, fs.redact(chk),
            location, other_job(meta, job_name))
