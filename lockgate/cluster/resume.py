"""Running a job again: it resumes, or it is refused; output is never doubled.

As with Spark Structured Streaming's checkpoint location, a pipeline run
again with the same name and checkpoint storage resumes its earlier run from
that run's latest completed checkpoint (or from the savepoint a stop ended it
with), in the same job folder under the same job id, and says so on one line.
A bounded job that ran to its end resumes from its final checkpoint and has
nothing new to read. A job that starts from nothing (no earlier run with a
completed checkpoint, ``fresh=True``, or a restore that holds no state of a
sink) is refused when a ``FileSink`` of it would write into a folder that
already holds that sink's committed output, unless the sink says what to do
with it (``mode="append"`` or ``"overwrite"``).

Layout of a job folder (``<storage>/<job-id>/``): ``chk-<n>`` folders, a
``chk-<n>`` without ``_metadata`` never completed; ``_stopped`` (JSON, written
by :func:`record_stop`) names the savepoint a stop ended the run with.
Everything read here is untrusted: folder names are matched, ``_metadata`` is
read by :func:`lockgate.checkpoint.storage.read_metadata`, ``_stopped`` is
checked field by field.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate import fs
from lockgate.api.plan import OperatorKind
from lockgate.checkpoint import storage
from lockgate.checkpoint.kinds import CheckpointKind
from lockgate.checkpoint.metadata import CheckpointMetadata
from lockgate.errors import CheckpointCorruptError, LockgateError, PipelineDefinitionError

if TYPE_CHECKING:
    from lockgate.api.pipeline import Pipeline
    from lockgate.cluster.options import RunOptions
    from lockgate.graph.jobgraph import JobGraph

log = logging.getLogger("lockgate.driver")

STOPPED = "_stopped"
"""In a job folder: the savepoint a stop ended the run with (JSON)."""

FRESH = "fresh=True (lockgate run --fresh)"


def job_slug(name: str) -> str:
    """The prefix of a pipeline's job ids (``<slug>-<8 hex digits>``)."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name).strip("-") or "job"


@dataclass(frozen=True)
class EarlierRun:
    """What an earlier run of a pipeline left in its checkpoint storage."""

    job_id: str
    job_dir: str
    resume_from: str | None
    """Its latest completed checkpoint, or the savepoint its stop took; None:
    it left no completed one."""
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    metadata: CheckpointMetadata | None = None

    @property
    def finished(self) -> bool:
        """Every operator had ended its input (a bounded job that ran to its end)."""
        ops = self.metadata.operators.values() if self.metadata else []
        return bool(ops) and all(op.finished for op in ops)


def earlier_runs(storage_root: str, name: str, job_id: str | None = None) -> list[EarlierRun]:
    """The earlier runs of the pipeline ``name`` in ``storage_root`` (the
    folder ``job_id`` only, when the job has a fixed id), the newest
    completed checkpoint first; runs without one come last."""
    root = fs.absolute(storage_root)
    if not fs.is_dir(root):
        return []
    pattern = (re.compile(re.escape(job_id) + "$") if job_id
               else re.compile(re.escape(job_slug(name)) + r"-[0-9a-f]{8}$"))
    runs = []
    for folder in sorted(fs.listdir(root)):
        if pattern.match(folder) and fs.is_dir(fs.join(root, folder)):
            run = _earlier_run(fs.join(root, folder), folder, name)
            if run is not None:
                runs.append(run)
    return sorted(runs, key=lambda r: -(r.metadata.timestamp if r.metadata else -1.0))


def _earlier_run(job_dir: str, job_id: str, name: str) -> EarlierRun | None:
    """The run in ``job_dir``; None when its checkpoints are another pipeline's."""
    ids = storage.completed_checkpoints(job_dir)
    path = storage.checkpoint_dir(job_dir, ids[-1]) if ids else None
    kind = CheckpointKind.CHECKPOINT
    stopped = read_stop(job_dir)
    if stopped is not None and (not ids or stopped[1] > ids[-1]):
        path, kind = stopped[0], CheckpointKind.SAVEPOINT
        if not fs.exists(fs.join(path, storage.METADATA)):
            raise CheckpointCorruptError(
                f"the earlier run {job_id} of job {name!r} was stopped with the savepoint "
                f"{fs.redact(path)}, which is gone; resuming from an older checkpoint would "
                "write again what that stop committed. Give the savepoint back, or start "
                f"afresh with {FRESH} and a fresh output folder")
    if path is None:
        return EarlierRun(job_id, job_dir, None) if storage.checkpoint_folders(job_dir) else None
    meta = storage.read_metadata(path, kind)
    if meta.job_name is not None and meta.job_name != name:
        return None  # a pipeline whose name gives the same job-id prefix
    return EarlierRun(job_id, job_dir, path, kind, meta)


def read_stop(job_dir: str) -> tuple[str, int] | None:
    """The savepoint (folder, checkpoint id) ``_stopped`` names, if any."""
    where = fs.join(job_dir, STOPPED)
    if not fs.exists(where):
        return None
    try:
        data: Any = json.loads(fs.read_bytes(where))
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{fs.redact(where)} cannot be read ({e}): remove it to "
                                     "resume from the job's checkpoints") from e
    path, n = (data.get("savepoint"), data.get("checkpoint_id")) if isinstance(data, dict) \
        else (None, None)
    if not isinstance(path, str) or not path or type(n) is not int or n < 0:
        raise CheckpointCorruptError(f"{fs.redact(where)} is damaged: remove it to resume "
                                     "from the job's checkpoints")
    return path, n


def record_stop(job_dir: str, savepoint: str, checkpoint_id: int) -> None:
    """A stop ended the run with ``savepoint``: the next run resumes from it."""
    try:
        fs.write_atomic(fs.join(job_dir, STOPPED), json.dumps(
            {"savepoint": savepoint, "checkpoint_id": checkpoint_id}).encode())
    except (OSError, ValueError) as e:
        log.warning("could not record in %s that the job stopped with %s: %s",
                    fs.redact(job_dir), fs.redact(savepoint), e)


def drop_incomplete(job_dir: str, above: int = 0) -> None:
    """Delete the checkpoint folders above ``above`` that never completed
    (no ``_metadata``): no task writes into them any more. Errors are logged."""
    try:
        folders = storage.checkpoint_folders(job_dir)
    except (OSError, ValueError) as e:
        log.warning("cannot list %s: %s", fs.redact(job_dir), e)
        return
    for n, completed in folders.items():
        if not completed and n > above:
            try:
                fs.rmtree(storage.checkpoint_dir(job_dir, n))
            except (OSError, ValueError) as e:
                log.warning("could not delete the incomplete checkpoint %s: %s",
                            fs.redact(storage.checkpoint_dir(job_dir, n)), e)


def resume_earlier_run(pipeline: Pipeline, options: RunOptions) -> EarlierRun | None:
    """Make ``options`` resume the pipeline's earlier run, when it has one
    with a completed checkpoint and the job names no checkpoint, savepoint
    or ``fresh`` start; returns that run (None: the job starts as asked)."""
    if options.restore_from or options.fresh:
        return None
    runs = earlier_runs(pipeline.checkpoint.storage, pipeline.name, options.job_id)
    run = next((r for r in runs if r.resume_from is not None), None)
    if run is None or run.resume_from is None:
        return None
    from lockgate.web import discovery

    running = next((j for j in discovery.discover() if j.job_id == run.job_id), None)
    if running is not None:  # its driver on this machine still runs it
        raise PipelineDefinitionError(
            f"job {run.job_id} still runs (driver pid {running.pid}): a second run of it "
            "would resume from the same checkpoint and write its output again. Wait for it, "
            f"end it (lockgate stop {run.job_id} --savepoint, or lockgate cancel "
            f"{run.job_id}), or start this one with {FRESH} and another output folder")
    if run.kind == CheckpointKind.SAVEPOINT:
        options.from_savepoint = run.resume_from
    else:
        options.from_checkpoint = run.resume_from
    options.job_id = run.job_id
    options.resumed = True
    return run


def announce(run: EarlierRun) -> None:
    """The one line that says the job resumes (stderr)."""
    meta = run.metadata
    done = "; it had read all its input, so nothing new is read" if run.finished else ""
    read = f", {meta.progress.read:,} records read" if meta else ""
    print(f"job {run.job_id} resumes from its latest completed {run.kind} "
          f"{fs.redact(run.resume_from or '')}{read}{done}; to start from nothing "
          "instead: fresh=True, or lockgate run --fresh", file=sys.stderr, flush=True)


def refused_resume(run: EarlierRun, error: LockgateError) -> LockgateError:
    """A resume the checkpoint refuses: the reason, and the choices."""
    return type(error)(
        f"job {run.job_id} cannot resume its earlier run from {fs.redact(run.resume_from or '')}:"
        f" {error} Choose one: make the pipeline fit that {run.kind} again; or start afresh "
        f"with {FRESH}, writing to a fresh output folder or with FileSink(..., "
        "mode=\"overwrite\") or mode=\"append\"; or use another checkpoint storage")


def check_sink_folders(graph: JobGraph, restored: CheckpointMetadata | None,
                       fresh: bool) -> None:
    """Before a job starts: each ``FileSink`` without state to restore
    (``restored`` holds none for its uid) refuses a folder that holds
    committed part files of its uid (``mode="error"``, the default), deletes
    them (``"overwrite"``) or adds to them (``"append"``)."""
    from lockgate.connectors.filesink import FileSink, existing_parts

    for op in graph.operators():
        if op.kind != OperatorKind.SINK or not isinstance(op.fn, FileSink):
            continue
        if restored is not None and op.uid in restored.operators:
            continue
        mode = getattr(op.fn, "mode", "error")
        if mode == "append":
            continue
        visible, hidden = existing_parts(op.fn.path, op.uid)
        if mode == "overwrite":
            for name in visible + hidden:
                fs.remove(fs.join(op.fn.path, name))
            if visible or hidden:
                fs.sync_dir(op.fn.path)
                log.warning("file sink %r: deleted %d part files of an earlier run in %s "
                            "(mode=\"overwrite\")", op.uid, len(visible) + len(hidden),
                            fs.redact(op.fn.path))
            continue
        if not visible:
            continue
        why = ("it starts afresh (fresh=True)" if fresh else
               "the checkpoint or savepoint it starts from holds no state of it"
               if restored is not None else
               "this job starts from nothing: no earlier run of it left a completed "
               "checkpoint in its checkpoint storage")
        raise PipelineDefinitionError(
            f"file sink {op.uid!r} would write a second copy: {fs.redact(op.fn.path)} holds "
            f"{len(visible)} committed part file(s) of it from an earlier run, and {why}. "
            "Choose one: resume that run (--from-checkpoint/--from-savepoint PATH; a run "
            "with a completed checkpoint in the same checkpoint storage resumes by itself); "
            "write to a fresh output folder; or say what to do with the old files: "
            "FileSink(..., mode=\"overwrite\") replaces them, mode=\"append\" adds to them")
