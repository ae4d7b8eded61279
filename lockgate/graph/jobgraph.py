"""Pipeline -> job graph: uids, chaining, partitioning. Pure: no I/O.

Operators joined by a forward edge with equal parallelism, where the upstream
has no other consumer, are *chained*: they run in one task as plain function
calls over batches. Every other edge becomes a network exchange. A side
output (``stream.side_output(tag)``) is an edge of its own from the operator
that emits it (``OutputEdge.tag``), never chained: so that operator is always
the last of its chain.

Several inputs (``connect``, joins): every edge names the input of the
operator it feeds (``input_index``), and such an operator heads a vertex of
its own. A ``union`` is no vertex: its inputs become edges of its consumer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.errors import PipelineDefinitionError

if TYPE_CHECKING:
    from lockgate.api.nodes import Node
    from lockgate.api.pipeline import Pipeline

__all__ = ["OperatorSpec", "InputEdge", "OutputEdge", "JobVertex", "JobGraph", "build_job_graph"]


@dataclass
class OperatorSpec:
    uid: str
    kind: OperatorKind
    fn: Any
    key_selector: Any = None
    uid_generated: bool = False
    watermarks: Any = None
    """A source's ``WatermarkStrategy`` (or None)."""


@dataclass
class InputEdge:
    upstream: int
    upstream_parallelism: int
    partitioning: Partitioning
    input_index: int = 0
    """Which input of the vertex's first operator the edge feeds (``connect``,
    joins: 0 or 1; the edges of a ``union`` all feed the same input)."""


@dataclass
class OutputEdge:
    downstream: int
    downstream_parallelism: int
    partitioning: Partitioning
    key_selector: Any = None
    downstream_uid: str = ""
    """The uid of the operator the edge leads to (whose key selector it applies)."""
    upstream_uid: str = ""
    """The uid of the operator whose records the edge carries (the last of its chain)."""
    tag: str | None = None
    """None: the operator's main output; else the name of the side output
    (``OutputTag``) the edge carries."""
    input_index: int = 0
    """Which input of the downstream operator the edge feeds."""


@dataclass
class JobVertex:
    id: int
    parallelism: int
    operators: list[OperatorSpec]
    inputs: list[InputEdge] = field(default_factory=list)
    outputs: list[OutputEdge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " -> ".join(op.uid for op in self.operators)

    @property
    def is_source(self) -> bool:
        return self.operators[0].kind == OperatorKind.SOURCE


@dataclass
class JobGraph:
    name: str
    max_parallelism: int
    vertices: list[JobVertex]

    def task_offsets(self) -> list[int]:
        """Global number of task 0 of each vertex."""
        offsets, n = [], 0
        for v in self.vertices:
            offsets.append(n)
            n += v.parallelism
        return offsets

    @property
    def num_tasks(self) -> int:
        return sum(v.parallelism for v in self.vertices)

    def tasks(self) -> list[tuple[int, int]]:
        """``(vertex id, subtask index)`` of every task, by global task number."""
        return [(v.id, i) for v in self.vertices for i in range(v.parallelism)]

    def operators(self) -> list[OperatorSpec]:
        return [op for v in self.vertices for op in v.operators]

    def operator_parallelism(self) -> dict[str, int]:
        return {op.uid: v.parallelism for v in self.vertices for op in v.operators}


def _assign_uids(nodes: list[Node]) -> dict[int, tuple[str, bool]]:
    uids: dict[int, tuple[str, bool]] = {}
    taken = {n.uid for n in nodes if n.uid}
    for n in nodes:
        if n.uid:
            uids[n.id] = (n.uid, False)
            continue
        uid = f"{n.kind}-{n.id}"
        while uid in taken:
            uid += "_"
        taken.add(uid)
        uids[n.id] = (uid, True)
    generated = [uids[n.id][0] for n in nodes
                 if uids[n.id][1] and n.kind != OperatorKind.UNION]
    if generated:
        warnings.warn(
            f"operators without a uid got generated ones derived from their position "
            f"({', '.join(generated)}); state cannot follow them if the pipeline's shape "
            "changes: give every stateful operator uid='...'",
            stacklevel=4,
        )
    return uids


def build_job_graph(pipeline: Pipeline) -> JobGraph:
    """Chain the pipeline's operators into job vertices."""
    nodes = pipeline.nodes
    if not nodes:
        raise PipelineDefinitionError("the pipeline is empty: add a source with p.source(...)")
    for n in nodes:
        if n.kind != OperatorKind.SINK and not n.consumers:
            uid = n.uid or f"{n.kind}-{n.id}"
            raise PipelineDefinitionError(
                f"operator {uid!r} has no consumer: end every stream with .sink(...)"
            )
    uids = _assign_uids(nodes)
    vertex_of: dict[int, int] = {}
    vertices: list[JobVertex] = []
    for n in nodes:
        if n.kind == OperatorKind.UNION:
            continue  # no operator: its consumers read its inputs' edges
        up = nodes[n.input] if n.input is not None else None
        spec = OperatorSpec(uids[n.id][0], n.kind, n.fn, n.key_selector, uids[n.id][1],
                            n.watermarks)
        chainable = (
            up is not None
            and up.kind != OperatorKind.UNION
            and not n.extra_inputs
            and n.partitioning == Partitioning.FORWARD
            and up.parallelism == n.parallelism
            and len(up.consumers) == 1
            and n.side_tag is None
        )
        if chainable:
            assert up is not None
            v = vertices[vertex_of[up.id]]
            v.operators.append(spec)
            vertex_of[n.id] = v.id
            continue
        v = JobVertex(len(vertices), n.parallelism, [spec])
        vertices.append(v)
        vertex_of[n.id] = v.id
        for index, up_id, part, key_selector, tag in _inputs(n, nodes):
            uv = vertices[vertex_of[up_id]]
            if any(e.upstream == uv.id for e in v.inputs):
                raise PipelineDefinitionError(
                    f"operator {spec.uid!r} reads the operators {uv.name!r} twice (a union "
                    "or join of a stream with itself): put a map(...) on one of the two")
            if part == Partitioning.FORWARD and uv.parallelism != v.parallelism:
                part = Partitioning.REBALANCE
            uv.outputs.append(OutputEdge(v.id, v.parallelism, part, key_selector, spec.uid,
                                          uids[up_id][0], tag, index))
            v.inputs.append(InputEdge(uv.id, uv.parallelism, part, index))
    return JobGraph(pipeline.name, pipeline.max_parallelism, vertices)


def _inputs(n: Node, nodes: list[Node]) -> list[tuple[int, int, Partitioning, Any, str | None]]:
    """``(input index, upstream node, partitioning, key selector, side tag)``
    of every edge into ``n``: a union's inputs stand for the union (the
    consumer's partitioning and key selector apply to each)."""
    direct = ([(n.input, n.partitioning, n.key_selector, n.side_tag)]
              if n.input is not None else [])
    direct += [(i.node, i.partitioning, i.key_selector, i.side_tag) for i in n.extra_inputs]
    out = []
    for index, (up_id, part, key_selector, tag) in enumerate(direct):
        for real, real_tag in _expand(up_id, tag, nodes):
            out.append((index, real, part, key_selector, real_tag))
    return out


def _expand(up_id: int, tag: str | None, nodes: list[Node]) -> list[tuple[int, str | None]]:
    """The real upstream nodes behind ``up_id`` (itself, or a union's inputs)."""
    up = nodes[up_id]
    if up.kind != OperatorKind.UNION:
        return [(up_id, tag)]
    assert up.input is not None
    parts = [(up.input, up.side_tag)] + [(i.node, i.side_tag) for i in up.extra_inputs]
    return [e for node, t in parts for e in _expand(node, t, nodes)]
