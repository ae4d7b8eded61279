"""A job from its definition to a job master ready to run (in the driver).

Everything that can be refused is refused here, before Spark is used or a
job folder is made: the pipeline's connectors, functions that cannot be sent
to the tasks, a non-replayable source under exactly-once, and the checkpoint
or savepoint the job starts from (read, verified, matched to the job by uid
and sink location). Then the end-to-end guarantee the job's parts allow is
known, and the Spark context (for the ``spark`` launcher) is ready. A local
session Lockgate starts begins during those checks (its JVM and warm Spark
daemon start while they run: :func:`~lockgate.cluster.spark.session.prestart`)
and is ended if the job is refused.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from lockgate import fs
from lockgate.api.plan import OperatorKind
from lockgate.api.result import Guarantee, JobResult, end_to_end_guarantee
from lockgate.checkpoint import storage
from lockgate.checkpoint.kinds import CheckpointKind
from lockgate.checkpoint.restore import check_channel_state
from lockgate.cluster import resume
from lockgate.cluster.autoscaler import tasks_at_most
from lockgate.cluster.coordinator import CompletedCheckpoint
from lockgate.cluster.jobmaster import JobMaster
from lockgate.cluster.options import RunOptions
from lockgate.cluster.provenance import check_sink_locations
from lockgate.config import CheckpointingMode
from lockgate.errors import (
    CheckpointCorruptError,
    JobInterrupted,
    LockgateError,
    PipelineDefinitionError,
)
from lockgate.graph.jobgraph import JobGraph, build_job_graph
from lockgate.runtime.steps import Steps, mark

if TYPE_CHECKING:
    from lockgate.api.client import JobClient
    from lockgate.api.pipeline import Pipeline

log = logging.getLogger("lockgate.driver")


def run_pipeline(pipeline: Pipeline, options: RunOptions) -> JobResult:
    """Run a job to its end in this thread (``Pipeline.run``), its progress
    on stderr (:func:`~lockgate.cluster.progress.run_with_progress`)."""
    from lockgate.cluster import interrupt
    from lockgate.cluster.progress import run_with_progress

    with interrupt.on_ctrl_c():  # from here: Ctrl-C ends the job cleanly
        try:
            master = prepare_job(pipeline, options)
        except KeyboardInterrupt:
            raise interrupted_before_start(pipeline.name) from None
        if interrupt.pressed():  # during the checks: nothing runs
            master.server.close()
            raise interrupted_before_start(pipeline.name)
        return run_with_progress(master, options.progress)


def interrupted_before_start(name: str) -> JobInterrupted:
    """Ctrl-C before the job started: one line, no traceback, exit code 130."""
    print(f"job {name!r} interrupted before it started: nothing ran", file=sys.stderr,
          flush=True)
    return JobInterrupted(name, None)


def start_pipeline(pipeline: Pipeline, options: RunOptions) -> JobClient:
    """Start a job in a background thread of the driver (``Pipeline.start``)."""
    from lockgate.api.client import JobClient

    return JobClient(prepare_job(pipeline, options))


def prepare_job(pipeline: Pipeline, options: RunOptions) -> JobMaster:
    """Check a pipeline and make its job master (nothing runs yet)."""
    steps: Steps = {}
    mark(steps, "run")
    graph = build_job_graph(pipeline)
    check_parallelism(graph)
    check_autoscale(graph, pipeline)
    if options.launcher == "local":  # its imports overlap the checks below
        from lockgate.cluster.local.forks import prestart, task_modules

        prestart(task_modules(graph, pipeline.checkpoint.storage))
    elif options.launcher == "spark":  # a new local session's JVM starts during the checks
        from lockgate.cluster.spark import session as spark_session
        from lockgate.cluster.spark.naming import app_name

        cancel_prestart = spark_session.cancel_prestart
        try:
            spark_session.prestart(options.spark, options.master,
                                   tasks_at_most(graph, pipeline.autoscale),
                                   app_name(pipeline.name))
        except Exception as e:
            log.debug("no early Spark session: %s", e)
            cancel_prestart()
        try:
            return _prepare(pipeline, options, graph, steps)
        except BaseException:
            cancel_prestart()  # refused: the session it began is not wanted
            raise
    return _prepare(pipeline, options, graph, steps)


def _prepare(pipeline: Pipeline, options: RunOptions, graph: JobGraph,
             steps: Steps) -> JobMaster:
    sources = [op for op in graph.operators() if op.kind == OperatorKind.SOURCE]
    sinks = [op for op in graph.operators() if op.kind == OperatorKind.SINK]
    mode = pipeline.checkpoint.mode
    for op in sources + sinks:
        op.fn.validate()
    check_picklable(graph)
    not_replayable = [op.uid for op in sources if not op.fn.replayable]
    check_non_replayable(not_replayable, [op.uid for op in sources], mode,
                         options.allow_non_replayable)
    guarantee = end_to_end_guarantee(
        [op.fn.replayable for op in sources], [op.fn.exactly_once for op in sinks], mode)
    if guarantee == Guarantee.AT_MOST_ONCE:
        log.warning("job %s runs AT-MOST-ONCE: source(s) %s cannot replay, so what they "
                    "delivered since the last checkpoint is LOST on a failure",
                    pipeline.name, not_replayable)
    elif guarantee != Guarantee.EXACTLY_ONCE:
        log.warning("job %s runs with end-to-end guarantee %s", pipeline.name,
                    guarantee.replace("_", "-").upper())
    started_from = None
    # run again: resume the earlier run of this pipeline in its checkpoint storage
    earlier = resume.resume_earlier_run(pipeline, options)
    if options.restore_from:  # refused here, before anything starts or is created
        try:
            started_from = load_checkpoint(
                options.restore_from, graph, options.allow_non_restored_state,
                job_name=pipeline.name, kind=options.restore_kind)
        except LockgateError as e:
            if earlier is None:
                raise
            raise resume.refused_resume(earlier, e) from e
    # never a second copy of a file sink's output from an earlier run
    resume.check_sink_folders(graph, started_from.metadata if started_from else None,
                              options.fresh)
    if earlier is not None:
        resume.drop_incomplete(earlier.job_dir, above=earlier.metadata.checkpoint_id
                               if earlier.metadata else 0)
        resume.announce(earlier)
    if options.launcher == "spark":  # a SparkContext that runs every task at once, first
        from lockgate.cluster.spark.naming import app_name
        from lockgate.cluster.spark.session import prepare_spark

        options.bind_host = prepare_spark(options.spark, options.master, graph.num_tasks,
                                          name=app_name(pipeline.name),
                                          size=tasks_at_most(graph, pipeline.autoscale))
        mark(steps, "session")
        if options.bind_host != "127.0.0.1":
            _warn_unshared_paths(pipeline, sources, sinks)
    master = JobMaster(pipeline, graph, options, guarantee, started_from)
    for name, at in steps.items():
        master.startup.mark(name, at)
    master.startup.mark("master")
    return master


def check_parallelism(graph: JobGraph) -> None:
    """Every operator's parallelism is in 1..max_parallelism (a key group per
    task at least), checked before anything starts."""
    for v in graph.vertices:
        if not 1 <= v.parallelism <= graph.max_parallelism:
            uids = "->".join(op.uid for op in v.operators)
            raise PipelineDefinitionError(
                f"parallelism {v.parallelism} of {uids} must be in 1..max_parallelism "
                f"({graph.max_parallelism}): lower the parallelism (--parallelism), or raise "
                "Pipeline(max_parallelism=...) for a new job (it fixes the key groups of "
                "its state for good)")


def check_autoscale(graph: JobGraph, pipeline: Pipeline) -> None:
    """The autoscaler's ``exclude`` names operators of the job (a typo would
    exclude nothing)."""
    config = pipeline.autoscale
    if config is None:
        return
    uids = {op.uid for op in graph.operators()}
    unknown = sorted(set(config.exclude) - uids)
    if unknown:
        raise PipelineDefinitionError(
            f"AutoscalerConfig(exclude=...) names no operator of the job: {unknown}; "
            f"its uids: {sorted(uids)}")


def check_non_replayable(not_replayable: list[str], source_uids: list[str],
                         mode: CheckpointingMode | str,
                         allowed: bool | list[str] | tuple[str, ...]) -> None:
    """An exactly-once job refuses sources that cannot replay unless it opts
    into at-most-once for them: ``allowed`` is ``True`` (every such source)
    or names each of them by uid; a name that is no source is refused too
    (a typo would otherwise opt into nothing)."""
    if isinstance(allowed, bool):
        named: set[str] = set(not_replayable) if allowed else set()
    else:
        named = set(allowed)
        unknown = sorted(named - set(source_uids))
        if unknown:
            raise PipelineDefinitionError(
                f"allow_non_replayable names {unknown}, which are not sources of this job "
                f"(its sources: {sorted(source_uids)})")
    refused = [uid for uid in not_replayable if uid not in named]
    if refused and mode == CheckpointingMode.EXACTLY_ONCE:
        raise PipelineDefinitionError(
            f"source(s) {refused} cannot be replayed, so the job cannot be exactly-once: "
            "after a failure their records in flight would be lost. Use a replayable source, "
            f"or accept AT-MOST-ONCE for them by name: allow_non_replayable={refused!r} "
            "(or True for every such source)")


def check_picklable(graph: JobGraph) -> None:
    """Every operator's functions travel to the tasks pickled (cloudpickle):
    one that cannot be is named with the reason and the fix, before the job
    starts, instead of a raw ``TypeError`` from deep in the launcher."""
    import cloudpickle

    for op in graph.operators():
        for what, obj in (("function", op.fn), ("key selector", op.key_selector),
                          ("watermark strategy", op.watermarks)):
            if obj is None:
                continue
            try:
                cloudpickle.dumps(obj)
            except Exception as e:
                raise PipelineDefinitionError(
                    f"the {what} of operator {op.uid!r} cannot be sent to the tasks: "
                    f"{type(e).__name__}: {e}. It (or a global it uses) holds something that "
                    "cannot be pickled, such as a lock, a connection or an open file: create "
                    "that in open() (KeyedProcessFunction) or inside the function, not at "
                    "module level") from None


def load_checkpoint(path: str, graph: JobGraph,
                    allow_non_restored_state: bool = False,
                    job_name: str | None = None,
                    kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CompletedCheckpoint:
    """Read a checkpoint or savepoint a job starts from and check it fits the job.

    State of an operator uid the job no longer has is refused, unless
    ``allow_non_restored_state`` (then it is dropped, with a warning).
    Operators the job added start empty."""
    chk = fs.absolute(path)
    meta = storage.read_metadata(chk, kind)
    storage.verify_files(chk, meta.state_files())
    storage.verify_files(chk, meta.channel_state_files())
    check_sink_locations(meta, graph, chk, job_name)
    old_name = meta.job_name
    if old_name is not None and job_name is not None and old_name != job_name:
        log.info("job %r restores %s of job %r", job_name, fs.redact(chk), old_name)
    known = {op.uid for op in graph.operators()}
    unknown = sorted(set(meta.operators) - known)
    kind = meta.kind
    if unknown and not allow_non_restored_state:
        raise CheckpointCorruptError(
            f"{kind} {fs.redact(chk)} holds state of operator uid(s) {unknown} that the job "
            f"does not have (its uids: {sorted(known)}); give the operators their old uids, or "
            "drop that state with allow_non_restored_state=True (--allow-non-restored-state)"
        )
    if unknown:
        log.warning("dropping the state of operator uid(s) %s from %s: the job has no such "
                    "operator (allow_non_restored_state)", unknown, fs.redact(chk))
        meta = meta.without(set(unknown))
    added = sorted(known - set(meta.operators))
    if added:
        log.info("operator uid(s) %s have no state in %s: they start empty", added,
                 fs.redact(chk))
    if meta.max_parallelism != graph.max_parallelism:
        raise CheckpointCorruptError(
            f"checkpoint {chk} was taken with max_parallelism {meta.max_parallelism}, the "
            f"job has {graph.max_parallelism}; it fixes the key groups: use the same value"
        )
    check_channel_state(meta, graph.operator_parallelism(), f"checkpoint {fs.redact(chk)}",
                        heads={v.operators[0].uid for v in graph.vertices})
    committed = storage.committed_marker(chk) == meta.checkpoint_id
    return CompletedCheckpoint(meta.checkpoint_id, chk, meta, sinks_committed=committed)


def _warn_unshared_paths(pipeline: Pipeline, sources: list[Any], sinks: list[Any]) -> None:
    """On a cluster, a plain local path is most often a mistake: each executor
    would see its own folder. ``file://`` says "a shared mount" explicitly."""
    paths = [("checkpoint storage", pipeline.checkpoint.storage if pipeline.checkpoint else None)]
    paths += [(f"{op.kind} {op.uid!r}", getattr(op.fn, "path", None)) for op in sources + sinks]
    for what, path in paths:
        if isinstance(path, str) and not fs.is_url(path):
            log.warning("%s is the plain local path %s, but the job runs on a Spark cluster: "
                        "every executor must reach the same folder. Use s3://, hdfs://, or "
                        "file://%s if it is a shared mount", what, path, fs.absolute(path))
