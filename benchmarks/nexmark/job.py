"""A Nexmark job: the source, some queries, a sink per query."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.nexmark.generator import GeneratorConfig
from benchmarks.nexmark.queries import CORE, Windows
from benchmarks.nexmark.queries_more import MORE
from benchmarks.nexmark.source import WATERMARKS, NexmarkSource
from lockgate import CheckpointConfig, DataStream, Pipeline
from lockgate.connectors.base import Sink

QUERIES: dict[str, Callable[[DataStream[Any], Windows], DataStream[Any]]] = dict(
    sorted({**CORE, **MORE}.items(), key=lambda kv: int(kv[0][1:])))
"""Every query, in number order."""


def build(queries: list[str], events: int, sink_of: Callable[[str], Sink[Any]], *,
          parallelism: int = 1, config: GeneratorConfig | None = None,
          windows: Windows | None = None, paced: bool = False,
          storage: str = "checkpoints", interval: float | None = 10.0,
          batch_size: int = 1024, progress: str | None = None) -> Pipeline:
    """One source of ``events`` events and each query of ``queries`` on it,
    the results of ``q`` written to ``sink_of(q)`` (``progress``: the
    source's progress folder, see ``NexmarkSource``)."""
    unknown = [q for q in queries if q not in QUERIES]
    if unknown:
        raise ValueError(f"no such query {unknown}; there are {sorted(QUERIES)}")
    w = windows or Windows()
    p = Pipeline(f"nexmark-{'-'.join(queries)}", parallelism=parallelism, batch_size=batch_size,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage))
    stream = p.source(NexmarkSource(events, config, paced=paced, progress=progress), uid="events",
                      watermarks=WATERMARKS)
    for q in queries:
        QUERIES[q](stream, w).sink(sink_of(q), uid=f"{q}.out")
    return p
