"""A running job's rescale, checked before anything happens: the job graph
at the new parallelism (:func:`lockgate.graph.rescale.rescaled`) and, on the
Spark launcher, the task slots it needs (on a cluster, waited for a bounded
time while the job runs on). The job master then takes a synchronous
checkpoint, its sinks commit, its tasks end, and the next attempt runs at the
new parallelism from that checkpoint (docs/elasticity.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from lockgate.api.result import JobStatus
from lockgate.errors import ConfigurationError, LockgateError
from lockgate.graph.jobgraph import JobGraph
from lockgate.graph.rescale import rescaled

if TYPE_CHECKING:
    from lockgate.cluster.options import RunOptions

log = logging.getLogger("lockgate.driver")


class RescalableJob(Protocol):
    """What a rescale plan reads of the job master."""

    @property
    def job_id(self) -> str: ...

    @property
    def state(self) -> JobStatus: ...

    @property
    def graph(self) -> JobGraph: ...

    @property
    def options(self) -> RunOptions: ...


def submit_rescale(master: RescalableJob, parallelism: Any, vertices: Any,
                   submit: Callable[[dict[str, Any]], Future[dict[str, Any]]]
                   ) -> Future[dict[str, Any]]:
    """Check a rescale of ``master``'s job and hand it over (``submit``: the
    job master's command, whose future it returns) once the launcher can run
    its tasks. A bad request is refused at once (a failed future, the job
    goes on as it is). On a Spark cluster with too few task slots the job
    runs on while executors may still come (a worker that joins, executors
    granted): the rescale is handed over once they registered, or refused
    after :func:`~lockgate.cluster.spark.session.slot_wait` seconds."""
    try:
        graph = rescale_plan(master, parallelism, vertices)
    except LockgateError as e:
        return _failed(e)
    rescale = {"graph": graph, "requested": time.time()}
    if master.options.launcher != "spark":
        return submit(rescale)
    from pyspark import SparkContext

    from lockgate.cluster.spark import session

    sc = SparkContext._active_spark_context
    if sc is None:
        return _failed(_refused(master, graph, "the Spark launcher has no running SparkContext"))
    try:
        session.check_dynamic_allocation(sc, graph.num_tasks)
    except ConfigurationError as e:
        return _failed(_refused(master, graph, str(e)))
    if session.task_slots(sc) >= graph.num_tasks:
        return submit(rescale)
    wait = session.slot_wait(sc)
    if wait <= 0:
        return _failed(_refused(master, graph, session.rescale_slots_problem(
            sc, graph.num_tasks, session.task_slots(sc), 0.0, len(graph.vertices))))
    waiting: Future[dict[str, Any]] = Future()

    def when_slots() -> None:
        slots = session.await_slots(sc, graph.num_tasks, wait)
        if slots < graph.num_tasks:
            waiting.set_exception(_refused(master, graph, session.rescale_slots_problem(
                sc, graph.num_tasks, slots, wait, len(graph.vertices))))
            return
        log.info("job %s: %d task slots registered, the rescale to %d tasks goes on",
                 master.job_id, slots, graph.num_tasks)
        _chain(submit(rescale), waiting)

    log.info("job %s: the rescale to %d tasks waits up to %g s for task slots (the Spark "
             "application has %d)", master.job_id, graph.num_tasks, wait,
             session.task_slots(sc))
    threading.Thread(target=when_slots, daemon=True, name="rescale-slots").start()
    return waiting


def rescale_plan(master: RescalableJob, parallelism: Any, vertices: Any) -> JobGraph:
    """The job graph of ``master``'s job at ``parallelism`` (every vertex)
    and ``vertices`` (``{uid: N}``); raises a :class:`LockgateError` naming
    the problem (the job goes on as it is)."""
    if master.state not in (JobStatus.CREATED, JobStatus.RUNNING):
        raise LockgateError(f"job {master.job_id} is {master.state}: it cannot be rescaled")
    if vertices is not None and not (isinstance(vertices, dict) and all(
            isinstance(k, str) for k in vertices)):
        raise ConfigurationError(
            f"the vertices of a rescale are a mapping of operator uid to parallelism, "
            f"got {vertices!r}")
    return rescaled(master.graph, parallelism, vertices)


def _refused(master: RescalableJob, graph: JobGraph, problem: str) -> ConfigurationError:
    return ConfigurationError(
        f"the rescale to {graph.num_tasks} tasks is refused, the job goes on at its "
        f"parallelism ({master.graph.num_tasks} tasks): {problem}")


def _failed(error: BaseException) -> Future[dict[str, Any]]:
    failed: Future[dict[str, Any]] = Future()
    failed.set_exception(error)
    return failed


def _chain(source: Future[dict[str, Any]], target: Future[dict[str, Any]]) -> None:
    def copy(done: Future[dict[str, Any]]) -> None:
        error = done.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


def available_slots(launcher: str) -> int | None:
    """The tasks the launcher can run at once: the Spark application's task
    slots (None on the local launcher: no limit, or without a context)."""
    if launcher != "spark":
        return None
    from pyspark import SparkContext

    from lockgate.cluster.spark.session import task_slots

    sc = SparkContext._active_spark_context
    return None if sc is None else task_slots(sc)
