"""A running job's rescale, checked before anything happens: the job graph
at the new parallelism (:func:`lockgate.graph.rescale.rescaled`) and, on the
Spark launcher, the task slots it needs. The job master then takes a
synchronous checkpoint, its sinks commit, its tasks end, and the next attempt
runs at the new parallelism from that checkpoint (docs/elasticity.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from lockgate.api.result import JobStatus
from lockgate.errors import ConfigurationError, LockgateError
from lockgate.graph.jobgraph import JobGraph
from lockgate.graph.rescale import rescaled

if TYPE_CHECKING:
    from lockgate.cluster.options import RunOptions


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
    graph = rescaled(master.graph, parallelism, vertices)
    problem = slots_problem(master.options.launcher, graph.num_tasks)
    if problem is not None:
        raise ConfigurationError(
            f"the rescale to {graph.num_tasks} tasks is refused, the job goes on at its "
            f"parallelism ({master.graph.num_tasks} tasks): {problem}")
    return graph


def slots_problem(launcher: str, num_tasks: int) -> str | None:
    """Why the launcher cannot run ``num_tasks`` tasks at once, or None. The
    local launcher always can; the Spark launcher needs that many task slots
    for its barrier stage (:func:`~lockgate.cluster.spark.session.check_slots`)."""
    if launcher != "spark":
        return None
    from pyspark import SparkContext

    from lockgate.cluster.spark.session import check_slots

    sc = SparkContext._active_spark_context
    if sc is None:
        return "the Spark launcher has no running SparkContext"
    try:
        check_slots(sc, num_tasks)
    except ConfigurationError as e:
        return str(e)
    return None


def available_slots(launcher: str) -> int | None:
    """The tasks the launcher can run at once: the Spark application's task
    slots (None on the local launcher: no limit, or without a context)."""
    if launcher != "spark":
        return None
    from pyspark import SparkContext

    from lockgate.cluster.spark.session import task_slots

    sc = SparkContext._active_spark_context
    return None if sc is None else task_slots(sc)
