"""Building pipelines: ``Pipeline`` (``DataStream`` and ``KeyedStream`` live
in :mod:`lockgate.api.stream`, importable from here too; the graph's
``Node``s in :mod:`lockgate.api.nodes`).

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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from lockgate.api.broadcast import BroadcastStream, connect
from lockgate.api.joins import IntervalJoin, JoinedStreams
from lockgate.api.nodes import Node, add_node
from lockgate.api.plan import OperatorKind
from lockgate.api.stream import (
    ArrowStream,
    DataStream,
    KeyedStream,
    TwoStreamBuilders,
    set_two_stream_builders,
)
from lockgate.api.watermarks import WatermarkStrategy
from lockgate.config import (
    DEFAULT_BUFFER_TIMEOUT,
    AutoscalerConfig,
    CheckpointConfig,
    RestartStrategy,
    RestConfig,
)
from lockgate.connectors.base import Source
from lockgate.errors import PipelineDefinitionError
from lockgate.state.backends import StateBackend
from lockgate.state.backends import state_backend as resolve_state_backend
from lockgate.state.keygroups import DEFAULT_MAX_PARALLELISM

if TYPE_CHECKING:
    from lockgate.api.client import JobClient
    from lockgate.api.result import JobResult, Progress

T = TypeVar("T")

__all__ = ["Pipeline", "DataStream", "KeyedStream", "launched_by", "set_runner"]

LaunchHook = Callable[["Pipeline", dict[str, Any], bool], Any]
"""Who runs a pipeline whose ``run()``/``start()`` is called (the pipeline,
the call's arguments, whether it waits): ``lockgate run`` while it loads a
script (:func:`launched_by`)."""

# The operators over two streams are built above the streams (their builders
# return DataStreams); every stream comes from a Pipeline, so they are handed
# to the streams here.
set_two_stream_builders(TwoStreamBuilders(connect=connect, broadcast=BroadcastStream,
                                          join=JoinedStreams, interval_join=IntervalJoin))

_launch_hook: list[LaunchHook] = []
_runner: list[LaunchHook] = []


def set_runner(runner: LaunchHook) -> None:
    """Who runs a pipeline's ``run()``/``start()`` in this process: the
    driver (``lockgate.cluster.entry.submit``), which ``lockgate/__init__.py``
    sets. The API sits below the driver and does not import it."""
    _runner[:] = [runner]


@contextmanager
def launched_by(hook: LaunchHook) -> Iterator[None]:
    """While this block runs, ``Pipeline.run()`` and ``start()`` hand their
    pipeline and arguments to ``hook`` and return what it returns, instead
    of running the job themselves: the way Flink's command line runs the
    ``execute()`` of the program it submits, with its own options."""
    _launch_hook.append(hook)
    try:
        yield
    finally:
        _launch_hook.remove(hook)

class Pipeline:
    """A dataflow program: sources, operators and sinks.

    Args:
        name: the job's name (also the prefix of its job id).
        parallelism: default parallelism of every operator.
        max_parallelism: number of key groups; fixes how far keyed state can be
            rescaled for the life of the state.
        checkpoint: checkpointing settings; ``None`` for the defaults.
        restart: restart strategy on failure; ``None`` for the default,
            ``FailureRateRestart()``: restart at once unless more than 10
            failures came in the last 10 minutes (docs/checkpoints.md,
            *Restart strategies*).
        allow_pickle: let state hold arbitrary objects (pickled). Loading such a
            checkpoint executes code: only for checkpoints you trust.
        state_backend: where keyed state lives: ``"heap"`` (the default, Python
            dicts in memory), ``"rocksdb"``, or a
            :class:`~lockgate.state.backends.RocksDBStateBackend` with its
            options (state larger than memory, incremental checkpoints;
            docs/state-backends.md).
        batch_size: records per batch that sources emit.
        buffer_timeout: seconds a record may wait in a task's output buffer
            for more to batch with before it is sent on (Flink's buffer
            timeout). Full buffers (``batch_size`` records) go at once; lower
            it for lower latency at low rates, raise it for fewer, larger
            batches (docs/performance.md, *End-to-end latency of
            exactly-once output*).
        autoscale: the autoscaler (off by default): the job master sizes each
            vertex from its tasks' metrics and rescales the running job
            (:class:`~lockgate.config.AutoscalerConfig`, docs/elasticity.md).
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
        buffer_timeout: float = DEFAULT_BUFFER_TIMEOUT,
        state_backend: str | StateBackend | None = None,
        autoscale: AutoscalerConfig | None = None,
    ) -> None:
        if parallelism < 1:
            raise PipelineDefinitionError(f"parallelism must be >= 1, got {parallelism}")
        if parallelism > max_parallelism:
            raise PipelineDefinitionError(
                f"parallelism {parallelism} exceeds max_parallelism {max_parallelism}; "
                "raise max_parallelism (it fixes the number of key groups)"
            )
        if autoscale is not None and not isinstance(autoscale, AutoscalerConfig):
            raise PipelineDefinitionError(
                f"autoscale= takes an AutoscalerConfig, got {type(autoscale).__name__}")
        if autoscale is not None and autoscale.max is not None \
                and autoscale.max > max_parallelism:
            raise PipelineDefinitionError(
                f"the autoscaler's max ({autoscale.max}) exceeds max_parallelism "
                f"({max_parallelism}); lower it or raise max_parallelism")
        self.name = name
        self.parallelism = parallelism
        self.autoscale = autoscale
        self.max_parallelism = max_parallelism
        self.checkpoint = checkpoint or CheckpointConfig()
        self.restart = restart
        self.allow_pickle = allow_pickle
        self.state_backend: StateBackend = resolve_state_backend(state_backend)
        if batch_size < 1:
            raise PipelineDefinitionError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= buffer_timeout <= 10:
            raise PipelineDefinitionError(
                f"buffer_timeout must be between 0 and 10 seconds, got {buffer_timeout!r}")
        self.batch_size = batch_size
        self.buffer_timeout = float(buffer_timeout)
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
        node = add_node(self, OperatorKind.SOURCE, source, uid, parallelism, None)
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
        :class:`~lockgate.api.stream.ArrowStream` (``map_arrow``,
        ``key_by_column(...).aggregate_arrow(...)``, ...; docs/arrow.md)."""
        from lockgate.connectors.dataframe import DataFrameSource
        from lockgate.connectors.parquet import ArrowSource

        if hasattr(source, "sparkSession") and hasattr(source, "write"):
            source = DataFrameSource(source)
        if not isinstance(source, ArrowSource):
            source = ArrowSource(source, batch_rows=batch_rows, rate=rate)
        return ArrowStream(self, add_node(self, OperatorKind.SOURCE, source, uid, parallelism,
                                           None))

    # -- running ----------------------------------------------------------
    def run(self, *, launcher: str = "spark", from_checkpoint: str | None = None,
            from_savepoint: str | None = None, allow_non_restored_state: bool = False,
            allow_non_replayable: bool | list[str] = False,
            fault_injection: list[dict[str, Any]] | None = None,
            job_id: str | None = None,
            on_progress: Callable[[Progress], None] | None = None,
            spark: Any = None, master: str | None = None,
            rest: RestConfig | bool | None = None,
            progress: bool | None = None, fresh: bool = False,
            start_timeout: float = 120.0) -> JobResult:
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
            progress: what the job prints on stderr: ``None`` (the default)
                its start, its dashboard's URL, a status line that rewrites
                itself on a terminal (elsewhere a line per completed
                checkpoint and a plain line every 10 s), and a summary at the
                end, unless ``LOCKGATE_PROGRESS=0``; ``False`` nothing.
            fresh: start from nothing even though an earlier run of this
                pipeline (its name) left checkpoints in its checkpoint
                storage; without it (and without ``from_checkpoint`` or
                ``from_savepoint``) the job resumes from the latest completed
                checkpoint of that run, and says so (docs/checkpoints.md,
                *Running a job again*).
            start_timeout: seconds every task of an attempt has to start and
                register (default 120); an attempt that takes longer (a task
                or a Spark host that never comes up) fails with the reason in
                the log, and the job restarts under its restart strategy.
        """
        args = {k: v for k, v in locals().items() if k != "self"}
        result: JobResult = self._submit(args, wait=True)
        return result

    def start(self, **kwargs: Any) -> JobClient:
        """Start the job in a background thread and return a :class:`JobClient`
        (``savepoint()``, ``stop(drain=...)``, ``cancel()``, ``result()``).
        Takes the arguments of :meth:`run`."""
        client: JobClient = self._submit(kwargs, wait=False)
        return client

    def _submit(self, args: dict[str, Any], wait: bool) -> Any:
        """:meth:`run` (``wait``) or :meth:`start`: the driver runs it
        (:func:`set_runner`), or under ``lockgate run`` the command line
        (:func:`launched_by`)."""
        if _launch_hook:
            return _launch_hook[-1](self, args, wait)
        if not _runner:
            raise RuntimeError("no runner: import lockgate (its __init__ sets the driver's)")
        return _runner[-1](self, args, wait)
