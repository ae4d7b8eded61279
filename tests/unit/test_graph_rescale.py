"""The job graph at another parallelism (a running job's rescale): chains
kept, edges' task counts updated, forward edges between now unequal
parallelisms rebalanced, and every bad request refused with its reason."""

from __future__ import annotations

import pytest

from lockgate import Pipeline
from lockgate.api.plan import Partitioning
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.errors import ConfigurationError
from lockgate.graph.jobgraph import build_job_graph
from lockgate.graph.rescale import describe, rescaled


def graph():
    p = Pipeline("g", parallelism=2, max_parallelism=8)
    nums = p.source(SequenceSource(1, 10), uid="src")
    doubled = nums.map(lambda x: 2 * x, uid="double")
    doubled.sink(CollectSink(), uid="a")      # two consumers: forward edges, not chained
    (doubled.key_by(lambda x: x % 2).reduce(lambda a, b: a + b, uid="sums")
     .sink(CollectSink(), uid="b"))
    return build_job_graph(p)


def test_every_vertex_rescaled_with_its_edges():
    g = graph()
    new = rescaled(g, 3)
    assert set(describe(new).values()) == {3} and new.num_tasks == 3 * len(g.vertices)
    assert [[op.uid for op in v.operators] for v in new.vertices] == \
        [[op.uid for op in v.operators] for v in g.vertices]
    for v in new.vertices:
        assert all(e.upstream_parallelism == 3 for e in v.inputs)
        assert all(e.downstream_parallelism == 3 for e in v.outputs)
    assert describe(g) != describe(new)  # the original is untouched


def test_one_vertex_and_forward_edges_become_rebalance():
    g = graph()
    forward = [(v.id, e.downstream) for v in g.vertices for e in v.outputs
               if e.partitioning == Partitioning.FORWARD]
    assert forward
    new = rescaled(g, None, {"a": 1})
    by_id = {v.id: v for v in new.vertices}
    sink = next(v for v in new.vertices if v.operators[0].uid == "a")
    assert sink.parallelism == 1
    assert all(by_id[u].parallelism == 2 for u in by_id if u != sink.id)
    assert [e.partitioning for e in sink.inputs] == [Partitioning.REBALANCE]
    assert [e.upstream_parallelism for e in sink.inputs] == [2]


@pytest.mark.parametrize("n,vertices,message", [
    (0, None, "1..max_parallelism (8)"),
    (9, None, "1..max_parallelism (8)"),
    ("3", None, "must be an integer"),
    (True, None, "must be an integer"),
    (None, {"nope": 2}, "no operator of the job has the uid"),
    (None, {"sums": 0}, "1..max_parallelism"),
    (2, None, "already runs at that parallelism"),
    (None, None, "needs a parallelism"),
])
def test_bad_requests_refused(n, vertices, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(
            ")", r"\)").replace(".", r"\.")):
        rescaled(graph(), n, vertices)
