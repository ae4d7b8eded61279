"""Pipeline -> job graph: chaining, partitioning, uids."""

from __future__ import annotations

import pytest

from lockgate import Pipeline
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import build_job_graph


def test_forward_edges_of_equal_parallelism_chain():
    p = Pipeline("g", parallelism=2)
    (p.source(SequenceSource(1, 10), uid="src").map(str, uid="m1").filter(bool, uid="f")
       .key_by(len).reduce(max, uid="r").map(str, uid="m2").sink(CollectSink(), uid="out"))
    g = build_job_graph(p)
    assert [[op.uid for op in v.operators] for v in g.vertices] == [
        ["src", "m1", "f"], ["r", "m2", "out"]]
    assert g.vertices[0].outputs[0].partitioning == "hash"
    assert g.num_tasks == 4 and g.task_offsets() == [0, 2]


def test_parallelism_change_and_rebalance_break_chains():
    p = Pipeline("g", parallelism=2)
    s = p.source(SequenceSource(1, 10), uid="src")
    s.map(str, uid="wide", parallelism=3).rebalance().map(str, uid="m") \
     .sink(CollectSink(), uid="out")
    g = build_job_graph(p)
    assert [[op.uid for op in v.operators] for v in g.vertices] == [
        ["src"], ["wide"], ["m", "out"]]
    assert [e.partitioning for v in g.vertices for e in v.inputs] == ["rebalance", "rebalance"]


def test_generated_uids_warn_and_are_deterministic():
    def build():
        p = Pipeline("g")
        p.source(SequenceSource(1, 10)).map(str).sink(CollectSink())
        return p

    with pytest.warns(UserWarning, match="source-0, map-1, sink-2"):
        g1 = build_job_graph(build())
    with pytest.warns(UserWarning):
        g2 = build_job_graph(build())
    assert [op.uid for op in g1.operators()] == [op.uid for op in g2.operators()]


def test_definition_errors():
    p = Pipeline("g")
    s = p.source(SequenceSource(1, 10), uid="a")
    with pytest.raises(PipelineDefinitionError, match="used twice"):
        s.map(str, uid="a")
    with pytest.raises(PipelineDefinitionError, match="only contain"):
        s.map(str, uid="a b")
    s.map(str, uid="dangling")
    with pytest.raises(PipelineDefinitionError, match="no consumer"):
        build_job_graph(p)
    with pytest.raises(PipelineDefinitionError, match="max_parallelism"):
        Pipeline("g", parallelism=200)
    with pytest.raises(PipelineDefinitionError, match="buffer_timeout"):
        Pipeline("g", buffer_timeout=-0.01)
    with pytest.raises(PipelineDefinitionError, match="batch_size"):
        Pipeline("g", batch_size=0)
