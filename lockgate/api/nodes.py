"""The logical graph a pipeline builds, below every stream class: ``Node``
(one operator, before chaining), ``NodeInput`` (an operator's inputs after
the first), ``StreamGraph`` (what a stream needs of its pipeline) and the
two ways a node joins the graph: after one upstream node (``add_node``) or
reading several streams (``add_multi_input_node``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.api.watermarks import WatermarkStrategy
from lockgate.errors import PipelineDefinitionError

__all__ = ["Node", "NodeInput", "StreamGraph", "StreamInput", "add_node",
           "add_multi_input_node"]

_UID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass
class Node:
    """One operator of the logical pipeline (before chaining)."""

    id: int
    kind: OperatorKind
    fn: Any
    uid: str | None
    parallelism: int
    input: int | None = None
    partitioning: Partitioning = Partitioning.FORWARD
    """How records reach this node from its input."""
    key_selector: Callable[[Any], Any] | None = None
    name: str = ""
    consumers: list[int] = field(default_factory=list)
    watermarks: WatermarkStrategy | None = None
    """Sources only: how the source stamps its stream with watermarks."""
    side_tag: str | None = None
    """Which output of its input it reads: None for the main output, else the
    name of a side output (``OutputTag``)."""
    extra_inputs: list[NodeInput] = field(default_factory=list)
    """Inputs 1, 2, ... of an operator with several (``union``, ``connect``,
    joins); input 0 is ``input``, ``partitioning``, ``key_selector``, ``side_tag``."""


@dataclass
class NodeInput:
    """One more input of a node: which node, which of its outputs, how records
    reach the node (and by which key, hash-partitioned)."""

    node: int
    partitioning: Partitioning
    key_selector: Callable[[Any], Any] | None = None
    side_tag: str | None = None


class StreamGraph(Protocol):
    """What a stream needs of its pipeline (a ``Pipeline``): the default
    parallelism, the number of key groups, and the nodes so far."""

    parallelism: int
    max_parallelism: int
    nodes: list[Node]


def add_node(graph: StreamGraph, kind: OperatorKind, fn: Any, uid: str | None,
             parallelism: int | None, upstream: Node | None,
             partitioning: Partitioning = Partitioning.FORWARD,
             key_selector: Callable[[Any], Any] | None = None,
             side_tag: str | None = None) -> Node:
    """A node after ``upstream`` (none: a source), its uid and parallelism checked."""
    if uid is not None and not _UID_RE.match(uid):
        raise PipelineDefinitionError(
            f"uid {uid!r} may only contain letters, digits, '_', '-' and '.'"
        )
    if uid is not None and any(n.uid == uid for n in graph.nodes):
        raise PipelineDefinitionError(
            f"uid {uid!r} is used twice; every operator needs its own"
        )
    p = parallelism or graph.parallelism
    if p < 1 or p > graph.max_parallelism:
        raise PipelineDefinitionError(
            f"parallelism {p} of {kind} must be in 1..max_parallelism ({graph.max_parallelism})"
        )
    node = Node(len(graph.nodes), kind, fn, uid, p,
                upstream.id if upstream else None, partitioning, key_selector,
                name=getattr(fn, "__name__", kind), side_tag=side_tag)
    if upstream is not None:
        upstream.consumers.append(node.id)
    graph.nodes.append(node)
    return node


@dataclass(frozen=True)
class StreamInput:
    """One input of a multi-input operator, as the API holds it."""

    node: Node
    partitioning: Partitioning
    key_selector: Callable[[Any], Any] | None
    tag: str | None


def add_multi_input_node(graph: StreamGraph, kind: OperatorKind, fn: Any, uid: str | None,
                         parallelism: int | None, inputs: Sequence[StreamInput]) -> Node:
    """A node reading ``inputs`` (input ``i`` is ``inputs[i]``)."""
    par = parallelism or graph.parallelism
    resolved = []
    for i in inputs:
        if i.node.kind == OperatorKind.SINK:
            raise PipelineDefinitionError("a sink has no output stream")
        if i.node not in graph.nodes:
            raise PipelineDefinitionError("streams of different pipelines cannot be combined")
        part = i.partitioning
        if part == Partitioning.FORWARD and par != i.node.parallelism:
            part = Partitioning.REBALANCE
        resolved.append((i, part))
    first, part0 = resolved[0]
    node = add_node(graph, kind, fn, uid, parallelism, first.node, part0, first.key_selector,
                    first.tag)
    for i, part in resolved[1:]:
        node.extra_inputs.append(NodeInput(i.node.id, part, i.key_selector, i.tag))
        i.node.consumers.append(node.id)
    return node
