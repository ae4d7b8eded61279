"""Building pipelines: ``Pipeline``, ``DataStream`` and ``KeyedStream``.

Example::

    from lockgate import Pipeline, CheckpointConfig
    from lockgate.connectors import SequenceSource, FileSink

    p = Pipeline("sums-by-remainder", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
    (p.source(SequenceSource(1, 1_000_000), uid="numbers")
       .map(lambda x: (x % 100, 1, x), uid="triples")
       .key_by(lambda t: t[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums")
       .sink(FileSink("out/", format="jsonl"), uid="out"))
    p.run()
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lockgate.api.functions import KeyedProcessFunction, OutputTag
from lockgate.api.watermarks import WatermarkStrategy
from lockgate.config import CheckpointConfig, RestartStrategy, RestConfig
from lockgate.connectors.base import Sink, Source
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.types import OperatorKind, Partitioning
from lockgate.state.backends import StateBackend
from lockgate.state.backends import state_backend as resolve_state_backend
from lockgate.state.keygroups import DEFAULT_MAX_PARALLELISM

if TYPE_CHECKING:
    from lockgate.api.arrow import ArrowStream
    from lockgate.api.windowed import WindowedStream
    from lockgate.api.windows import WindowAssigner
    from lockgate.cluster.client import JobClient
    from lockgate.cluster.result import JobResult, Progress

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["Pipeline", "DataStream", "KeyedStream", "Node", "NodeInput"]

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


class Pipeline:
    """A dataflow program: sources, operators and sinks.

    Args:
        name: the job's name (also the prefix of its job id).
        parallelism: default parallelism of every operator.
        max_parallelism: number of key groups; fixes how far keyed state can be
            rescaled for the life of the state.
        checkpoint: checkpointing settings; ``None`` for the defaults.
        restart: restart strategy on failure.
        allow_pickle: let state hold arbitrary objects (pickled). Loading such a
            checkpoint executes code: only for checkpoints you trust.
        state_backend: where keyed state lives: ``"heap"`` (the default, Python
            dicts in memory), ``"rocksdb"``, or a
            :class:`~lockgate.state.backends.RocksDBStateBackend` with its
            options (state larger than memory, incremental checkpoints;
            docs/state-backends.md).
        batch_size: records per batch that sources emit.
    """

    def __init__(
        self,
        name: str,
        parallelism: int = 1,
        *,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        checkpoint: CheckpointConfig | None = None,
        restart: RestartStrategy | None = None,
        allow_pickle: bool = False,
        batch_size: int = 1024,
        state_backend: str | StateBackend | None = None,
    ) -> None:
        if parallelism < 1:
            raise PipelineDefinitionError(f"parallelism must be >= 1, got {parallelism}")
        if parallelism > max_parallelism:
            raise PipelineDefinitionError(
                f"parallelism {parallelism} exceeds max_parallelism {max_parallelism}; "
                "raise max_parallelism (it fixes the number of key groups)"
            )
        self.name = name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.checkpoint = checkpoint or CheckpointConfig()
        self.restart = restart
        self.allow_pickle = allow_pickle
        self.state_backend: StateBackend = resolve_state_backend(state_backend)
        self.batch_size = batch_size
        self.nodes: list[Node] = []

    # -- building ---------------------------------------------------------
    def source(self, source: Source[T], *, uid: str | None = None,
               parallelism: int | None = None,
               watermarks: WatermarkStrategy | None = None) -> DataStream[T]:
        """Add a source; returns its stream. With ``watermarks``, the stream
        carries event time (:mod:`lockgate.api.watermarks`)."""
        if not isinstance(source, Source):
            raise PipelineDefinitionError(f"{source!r} is not a lockgate Source")
        if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
            raise PipelineDefinitionError(
                f"watermarks= takes a WatermarkStrategy, got {type(watermarks).__name__}")
        node = self._add(OperatorKind.SOURCE, source, uid, parallelism, None)
        node.watermarks = watermarks
        return DataStream(self, node)

    def source_dataframe(self, df: Any, *, uid: str | None = None,
                         parallelism: int | None = None,
                         spark: Any = None) -> DataStream[dict[str, Any]]:
        """Add a bounded, replayable source reading a Spark DataFrame (or the
        table named ``df``, from ``spark`` or the active session): one ``dict``
        per row, with exact types (ints stay ints).

        At job start the driver materializes the DataFrame once, with Spark, as
        Parquet under ``<storage>/<job-id>/inputs/<uid>/`` (a file per Spark
        partition); the tasks read that copy in parallel, and every restart of
        the job replays it. A new job restored from a savepoint materializes the
        DataFrame again: it must then give the same rows per partition (like a
        table snapshot). See :mod:`lockgate.connectors.dataframe`.
        """
        from lockgate.connectors.dataframe import DataFrameSource

        return self.source(DataFrameSource(df, spark=spark), uid=uid, parallelism=parallelism)

    def source_arrow(self, source: Any, *, uid: str | None = None,
                     parallelism: int | None = None, batch_rows: int = 65_536,
                     rate: float | None = None) -> ArrowStream:
        """Add a source of ``pyarrow.RecordBatch`` es: a ``FileSource`` in
        Parquet format, a ``DataFrameSource`` or a Spark DataFrame, read as
        batches of at most ``batch_rows`` rows, with the same splits and
        checkpointed positions (file, row) as when read as rows. Returns an
        :class:`~lockgate.api.arrow.ArrowStream` (``map_arrow``,
        ``key_by_column(...).aggregate_arrow(...)``, ...; docs/arrow.md)."""
        from lockgate.api.arrow import ArrowStream
        from lockgate.connectors.dataframe import DataFrameSource
        from lockgate.connectors.parquet import ArrowSource

        if hasattr(source, "sparkSession") and hasattr(source, "write"):
            source = DataFrameSource(source)
        if not isinstance(source, ArrowSource):
            source = ArrowSource(source, batch_rows=batch_rows, rate=rate)
        return ArrowStream(self, self._add(OperatorKind.SOURCE, source, uid, parallelism, None))

    def _add(self, kind: OperatorKind, fn: Any, uid: str | None, parallelism: int | None,
             upstream: Node | None, partitioning: Partitioning = Partitioning.FORWARD,
             key_selector: Callable[[Any], Any] | None = None,
             side_tag: str | None = None) -> Node:
        if uid is not None and not _UID_RE.match(uid):
            raise PipelineDefinitionError(
                f"uid {uid!r} may only contain letters, digits, '_', '-' and '.'"
            )
        if uid is not None and any(n.uid == uid for n in self.nodes):
            raise PipelineDefinitionError(
                f"uid {uid!r} is used twice; every operator needs its own"
            )
        p = parallelism or self.parallelism
        if p < 1 or p > self.max_parallelism:
            raise PipelineDefinitionError(
                f"parallelism {p} of {kind} must be in 1..max_parallelism ({self.max_parallelism})"
            )
        node = Node(len(self.nodes), kind, fn, uid, p,
                    upstream.id if upstream else None, partitioning, key_selector,
                    name=getattr(fn, "__name__", kind), side_tag=side_tag)
        if upstream is not None:
            upstream.consumers.append(node.id)
        self.nodes.append(node)
        return node

    # -- running ----------------------------------------------------------
    def run(self, *, launcher: str = "spark", from_checkpoint: str | None = None,
            from_savepoint: str | None = None, allow_non_restored_state: bool = False,
            allow_non_replayable: bool | list[str] = False,
            fault_injection: list[dict[str, Any]] | None = None,
            job_id: str | None = None,
            on_progress: Callable[[Progress], None] | None = None,
            spark: Any = None, master: str | None = None,
            rest: RestConfig | bool | None = None,
            progress: bool | None = None) -> JobResult:
        """Run the job and block until it ends (bounded input done, stopped,
        cancelled, or failed).

        Args:
            launcher: ``"spark"`` (the default: every task is one task of a
                single Spark barrier stage, on ``spark`` or a local session) or
                ``"local"`` (one subprocess per task, no Spark).
            from_checkpoint: start from this completed checkpoint (a ``chk-N`` folder).
            from_savepoint: start from this savepoint (any parallelism; operators
                are matched by uid, added ones start empty).
            allow_non_restored_state: drop the state of operator uids the job no
                longer has, instead of refusing the checkpoint or savepoint.
            allow_non_replayable: run with sources that cannot replay (push
                sources) under exactly-once by downgrading the guarantee to
                at-most-once (the job reports it): the list of their uids, or
                ``True`` for every such source.
            fault_injection: test-only: kill tasks at named protocol points.
            job_id: the job's id (default: the name and a random suffix); its
                checkpoints go to ``<storage>/<job_id>/``.
            on_progress: called in the driver after every completed checkpoint.
            spark: with ``launcher="spark"``: the SparkSession to run on (default:
                the running one, or a new one on ``master``).
            master: with ``launcher="spark"`` and no session: the Spark master of
                the session Lockgate creates (default ``local[N]``, N = the job's
                number of tasks).
            rest: the driver's REST API, which ``lockgate list``, ``savepoint``,
                ``stop``, ``cancel`` and ``checkpoints`` use: on by default
                (127.0.0.1, a free port, a random token; see
                :class:`~lockgate.config.RestConfig` and its environment
                variables); ``False`` turns it off. Its dashboard is at ``/ui``
                (the URL is printed when the job starts; docs/dashboard.md).
            progress: the job's progress on stderr: ``None`` (the default) a
                status line that rewrites itself on a terminal, a plain line
                every 10 s elsewhere, unless ``LOCKGATE_PROGRESS=0``;
                ``False`` none.
        """
        from lockgate.cluster.options import RunOptions
        from lockgate.cluster.submission import run_pipeline

        args = {k: v for k, v in locals().items() if k not in ("self", "RunOptions",
                                                                "run_pipeline")}
        return run_pipeline(self, RunOptions(**args))

    def start(self, **kwargs: Any) -> JobClient:
        """Start the job in a background thread and return a :class:`JobClient`
        (``savepoint()``, ``stop(drain=...)``, ``cancel()``, ``result()``).
        Takes the arguments of :meth:`run`."""
        from lockgate.cluster.options import RunOptions
        from lockgate.cluster.submission import start_pipeline

        return start_pipeline(self, RunOptions(**kwargs))


class DataStream(Generic[T]):
    """A stream of records of type ``T``."""

    def __init__(self, pipeline: Pipeline, node: Node,
                 partitioning: Partitioning = Partitioning.FORWARD,
                 tag: str | None = None) -> None:
        self._p = pipeline
        self._node = node
        self._partitioning = partitioning
        self._tag = tag
        """None: the node's main output; else the side output of this name."""

    def _then(self, kind: OperatorKind, fn: Any, uid: str | None, parallelism: int | None,
              partitioning: Partitioning | None = None,
              key_selector: Callable[[Any], Any] | None = None) -> Node:
        if self._node.kind == OperatorKind.SINK:
            raise PipelineDefinitionError("a sink has no output stream")
        part = partitioning or self._partitioning
        p = parallelism or self._p.parallelism
        if part == Partitioning.FORWARD and p != self._node.parallelism:
            part = Partitioning.REBALANCE
        return self._p._add(kind, fn, uid, parallelism, self._node, part, key_selector,
                            self._tag)

    def map(self, fn: Callable[[T], U], *, uid: str | None = None,
            parallelism: int | None = None) -> DataStream[U]:
        """Apply ``fn`` to every record."""
        return DataStream(self._p, self._then(OperatorKind.MAP, fn, uid, parallelism))

    def filter(self, fn: Callable[[T], bool], *, uid: str | None = None,
               parallelism: int | None = None) -> DataStream[T]:
        """Keep the records for which ``fn`` is true."""
        return DataStream(self._p, self._then(OperatorKind.FILTER, fn, uid, parallelism))

    def flat_map(self, fn: Callable[[T], Iterable[U]], *, uid: str | None = None,
                 parallelism: int | None = None) -> DataStream[U]:
        """Replace every record by the records of the iterable ``fn`` returns."""
        return DataStream(self._p, self._then(OperatorKind.FLAT_MAP, fn, uid, parallelism))

    def map_batch(self, fn: Callable[[list[T]], list[U]], *, uid: str | None = None,
                  parallelism: int | None = None) -> DataStream[U]:
        """Apply ``fn`` to a whole batch (a list) at once; it returns a list."""
        return DataStream(self._p, self._then(OperatorKind.MAP_BATCH, fn, uid, parallelism))

    def async_map(self, fn: Any, *, capacity: int = 100, ordered: bool = True,
                  timeout: float | None = None,
                  on_timeout: Callable[[T], Any] | None = None, uid: str | None = None,
                  parallelism: int | None = None) -> DataStream[Any]:
        """Call an external service per record (Flink's ``AsyncDataStream``):
        ``fn`` is an ``async def`` (or an ``AsyncFunction``) whose result is
        the output record; at most ``capacity`` requests in flight per task,
        results in input order (``ordered``) or as they complete; a request
        longer than ``timeout`` seconds gives ``on_timeout(record)`` or fails
        the attempt. Requests in flight at a checkpoint are part of it and are
        issued again on recovery (:mod:`lockgate.api.async_io`).

        >>> enriched = clicks.async_map(lookup, capacity=64, timeout=2.0, uid="lookup")
        """
        from lockgate.api.async_io import as_async_function

        spec = as_async_function(fn, capacity=capacity, ordered=ordered, timeout=timeout,
                                 on_timeout=on_timeout)
        return DataStream(self._p, self._then(OperatorKind.ASYNC_MAP, spec, uid, parallelism))

    def to_arrow(self, schema: Any = None, *, uid: str | None = None,
                 parallelism: int | None = None) -> ArrowStream:
        """Each batch of records as one ``pyarrow.RecordBatch`` (dict records
        become columns, ``schema`` if given; other records one column
        ``value``): an :class:`~lockgate.api.arrow.ArrowStream`."""
        from lockgate.api.arrow import ArrowStream, to_arrow_step

        return ArrowStream(self._p, self._then(OperatorKind.ARROW, to_arrow_step(schema), uid,
                                               parallelism))

    def rebalance(self) -> DataStream[T]:
        """Spread the records round-robin over the next operator's tasks."""
        return DataStream(self._p, self._node, Partitioning.REBALANCE, self._tag)

    def key_by(self, key_selector: Callable[[T], Any]) -> KeyedStream[T]:
        """Partition by key: records with equal keys go to the same task."""
        return KeyedStream(self._p, self._node, key_selector, self._tag)

    def side_output(self, tag: OutputTag) -> DataStream[Any]:
        """The values this stream's operator emitted to the side output ``tag``
        (``ctx.output(tag, value)`` in a process or window function; a
        window's late records with ``side_output_late_data(tag)``).

        A side output travels on an edge of its own from the operator, with the
        same barriers and watermarks as its main output, so it is exactly-once
        like any stream.

        >>> late = windowed.side_output(OutputTag("late"))
        """
        if not isinstance(tag, OutputTag):
            raise PipelineDefinitionError(f"side_output takes an OutputTag, got {tag!r}")
        if self._tag is not None or self._node.kind not in (
                OperatorKind.PROCESS, OperatorKind.WINDOW, OperatorKind.CO_PROCESS,
                OperatorKind.BROADCAST_PROCESS, OperatorKind.INTERVAL_JOIN):
            raise PipelineDefinitionError(
                "side_output(tag) needs the stream of a process or window operator "
                "(.process(...), .window(...)....): only they emit side outputs")
        return DataStream(self._p, self._node, tag=tag.name)

    def union(self, *others: DataStream[T]) -> DataStream[T]:
        """One stream of this stream's records and those of ``others`` (same
        type), in no particular order between them (:mod:`lockgate.api.connected`)."""
        from lockgate.api.connected import union

        return union(self, others)

    def connect(self, other: Any) -> Any:
        """Two streams into one operator: ``ConnectedStreams`` (then
        ``.process(CoProcessFunction)``), or with a ``BroadcastStream`` a
        ``BroadcastConnectedStream`` (``.process(BroadcastProcessFunction)``)."""
        from lockgate.api.connected import connect

        return connect(self, other)

    def broadcast(self, *descriptors: Any) -> Any:
        """This stream sent to every task of the operator it is connected to,
        with broadcast state ``descriptors`` (``MapStateDescriptor``s):
        a ``BroadcastStream`` (:mod:`lockgate.api.broadcast`)."""
        from lockgate.api.broadcast import BroadcastStream

        return BroadcastStream(self, descriptors)

    def join(self, other: DataStream[Any]) -> Any:
        """A window join: ``a.join(b).where(ka).equal_to(kb).window(assigner)
        .apply(fn)`` (:mod:`lockgate.api.joins`)."""
        from lockgate.api.joins import JoinedStreams

        return JoinedStreams(self, other)

    def sink(self, sink: Sink[T], *, uid: str | None = None,
             parallelism: int | None = None) -> DataStream[T]:
        """Write the stream to ``sink``."""
        if not isinstance(sink, Sink):
            raise PipelineDefinitionError(f"{sink!r} is not a lockgate Sink")
        return DataStream(self._p, self._then(OperatorKind.SINK, sink, uid, parallelism))


class KeyedStream(Generic[T]):
    """A stream partitioned by key; its operators see keyed state."""

    def __init__(self, pipeline: Pipeline, node: Node, key_selector: Callable[[T], Any],
                 tag: str | None = None) -> None:
        self._p = pipeline
        self._node = node
        self._key = key_selector
        self._tag = tag

    def _keyed(self, kind: OperatorKind, fn: Any, uid: str | None,
               parallelism: int | None) -> Node:
        return self._p._add(kind, fn, uid, parallelism, self._node, Partitioning.HASH, self._key,
                            self._tag)

    def window(self, assigner: WindowAssigner, *,
               timestamp_of: Callable[[T], int] | None = None) -> WindowedStream[T]:
        """Group each key's records into windows (:mod:`lockgate.api.windows`);
        then ``.reduce``, ``.aggregate`` or ``.process`` the windows.

        Event-time windows need each record's timestamp (records do not carry
        one): ``timestamp_of``, by default the ``WatermarkStrategy``'s of the
        source, when only filters stand between it and the window.

        >>> counts = (clicks.key_by(lambda c: c["user"])
        ...                 .window(TumblingEventTimeWindows.of(60_000))
        ...                 .aggregate(Count(), uid="clicks-per-minute"))
        """
        from lockgate.api.windowed import WindowedStream

        return WindowedStream(self._p, self._node, self._key, self._tag, assigner, timestamp_of)

    def count_window(self, size: int, slide: int | None = None) -> WindowedStream[T]:
        """A window per ``size`` records of a key, in their arrival order
        (Flink's ``countWindow(size)``): it fires when its last record arrives.
        A key's last incomplete window never fires (and stays in state).
        With ``slide``: every ``slide``-th record of a key fires a window of
        its last ``size`` records (fewer at first), as Flink's
        ``countWindow(size, slide)``."""
        from lockgate.api.windowed import WindowedStream
        from lockgate.api.windows import CountWindows

        return WindowedStream(self._p, self._node, self._key, self._tag,
                              CountWindows(size, slide), None)

    def reduce(self, fn: Callable[[T, T], T], *, uid: str | None = None,
               parallelism: int | None = None) -> DataStream[T]:
        """Combine each record with its key's running value; emits every updated value.

        ``fn(acc, record)`` may mutate ``acc`` and return it (``a[1] += b[1];
        return a``): a mutable accumulator is copied before ``fn`` sees it, so
        every emitted value stays as it was emitted and a checkpoint holds the
        value as of its barrier, however the function or an operator
        downstream changes them later. Immutable accumulators (numbers,
        strings, tuples of them) are not copied: they are the fastest.

        >>> totals = stream.key_by(lambda kv: kv[0]).reduce(
        ...     lambda a, b: (a[0], a[1] + b[1]), uid="totals")
        """
        return DataStream(self._p, self._keyed(OperatorKind.REDUCE, fn, uid, parallelism))

    def process(self, fn: KeyedProcessFunction[T, U], *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[U]:
        """Run a ``KeyedProcessFunction`` with keyed state."""
        if not isinstance(fn, KeyedProcessFunction):
            raise PipelineDefinitionError(f"{fn!r} is not a KeyedProcessFunction")
        return DataStream(self._p, self._keyed(OperatorKind.PROCESS, fn, uid, parallelism))

    def connect(self, other: Any) -> Any:
        """With another ``KeyedStream``: keyed ``ConnectedStreams`` (both
        inputs share this operator's keyed state and timers); with a
        ``BroadcastStream``: ``.process(KeyedBroadcastProcessFunction)``."""
        from lockgate.api.connected import connect

        return connect(self, other)

    def interval_join(self, other: KeyedStream[Any], *,
                      timestamp_of: Callable[[T], int] | None = None,
                      other_timestamp_of: Callable[[Any], int] | None = None) -> Any:
        """An event-time interval join with ``other``: ``.between(lower,
        upper).process(ProcessJoinFunction)`` (:mod:`lockgate.api.joins`)."""
        from lockgate.api.joins import IntervalJoin

        return IntervalJoin(self, other, timestamp_of, other_timestamp_of)
