"""A job graph at another parallelism (a running job's rescale) — pure.

The chains stay as they are: only each vertex's parallelism changes, and the
edges' counts of tasks with it. A forward edge between two vertices whose
parallelisms now differ becomes a rebalance (as when the graph is built)."""

from __future__ import annotations

from dataclasses import replace

from lockgate.api.plan import Partitioning
from lockgate.errors import ConfigurationError
from lockgate.graph.jobgraph import InputEdge, JobGraph, JobVertex


def rescaled(graph: JobGraph, parallelism: int | None,
             vertices: dict[str, int] | None = None) -> JobGraph:
    """``graph`` with every vertex at ``parallelism`` (None: as it is), then
    the vertices named in ``vertices`` (by the uid of any of their operators)
    at theirs. Raises :class:`ConfigurationError` naming the problem when a
    parallelism is not in 1..max_parallelism, a uid is no operator's, or
    nothing would change."""
    vertices = dict(vertices or {})
    top = graph.max_parallelism
    asked = ([("the job", parallelism)] if parallelism is not None else []) + list(
        vertices.items())
    if not asked:
        raise ConfigurationError("a rescale needs a parallelism (N) or --vertex uid=N")
    for what, n in asked:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= top:
            raise ConfigurationError(
                f"parallelism {n!r} of {what} must be an integer in 1..max_parallelism "
                f"({top}); max_parallelism fixes the key groups of the job's state for good")
    by_uid = {op.uid: v.id for v in graph.vertices for op in v.operators}
    unknown = sorted(set(vertices) - set(by_uid))
    if unknown:
        raise ConfigurationError(
            f"no operator of the job has the uid(s) {unknown}; its uids: {sorted(by_uid)}")
    wanted = {v.id: parallelism if parallelism is not None else v.parallelism
              for v in graph.vertices}
    for uid, n in vertices.items():
        wanted[by_uid[uid]] = n
    if all(wanted[v.id] == v.parallelism for v in graph.vertices):
        raise ConfigurationError(
            "the job already runs at that parallelism: nothing to rescale "
            f"({', '.join(f'{v.name}: {v.parallelism}' for v in graph.vertices)})")
    new = []
    for v in graph.vertices:
        n = wanted[v.id]
        inputs = [InputEdge(e.upstream, wanted[e.upstream],
                            _partitioning(e.partitioning, wanted[e.upstream], n), e.input_index)
                  for e in v.inputs]
        outputs = [replace(e, downstream_parallelism=wanted[e.downstream],
                           partitioning=_partitioning(e.partitioning, n, wanted[e.downstream]))
                   for e in v.outputs]
        new.append(JobVertex(v.id, n, list(v.operators), inputs, outputs))
    return JobGraph(graph.name, graph.max_parallelism, new)


def _partitioning(part: Partitioning, upstream: int, downstream: int) -> Partitioning:
    if part == Partitioning.FORWARD and upstream != downstream:
        return Partitioning.REBALANCE
    return part


def describe(graph: JobGraph) -> dict[str, int]:
    """Each vertex's parallelism, by its name (``uid -> uid``)."""
    return {v.name: v.parallelism for v in graph.vertices}

