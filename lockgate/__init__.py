"""Lockgate: exactly-once stateful stream processing for Python."""

from lockgate.api.async_io import AsyncContext, AsyncFunction, AsyncTimeoutError
from lockgate.api.broadcast import (
    BroadcastProcessFunction,
    BroadcastStream,
    KeyedBroadcastProcessFunction,
)
from lockgate.api.connected import ConnectedStreams, CoProcessFunction
from lockgate.api.evictors import CountEvictor, Evictor, TimeEvictor
from lockgate.api.functions import KeyedProcessFunction, OutputTag, RuntimeContext
from lockgate.api.joins import ProcessJoinFunction
from lockgate.api.pipeline import DataStream, KeyedStream, Pipeline
from lockgate.api.pipeline import set_runner as _set_runner
from lockgate.api.stream import WindowedStream
from lockgate.api.triggers import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerContext,
    TriggerResult,
)
from lockgate.api.watermarks import (
    END_OF_TIME,
    MAX_WATERMARK,
    MIN_WATERMARK,
    TimeDomain,
    WatermarkStrategy,
)
from lockgate.api.windows import (
    AggregateFunction,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from lockgate.cluster.entry import submit as _submit
from lockgate.config import (
    AutoscalerConfig,
    CheckpointConfig,
    CheckpointingMode,
    ExponentialBackoffRestart,
    FailureHistory,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategy,
    RestConfig,
)
from lockgate.errors import LockgateError
from lockgate.state.backend import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from lockgate.state.ttl_config import (
    IncrementalCleanup,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
)

__version__ = "0.1.0"

# Pipeline.run() and start() run their job on the driver (lockgate.cluster),
# which sits above the API: the API is handed the driver's entry here.
_set_runner(_submit)

__all__ = [
    "BroadcastProcessFunction",
    "BroadcastStream",
    "CoProcessFunction",
    "ConnectedStreams",
    "KeyedBroadcastProcessFunction",
    "ProcessJoinFunction",
    "AsyncContext",
    "AsyncFunction",
    "AsyncTimeoutError",
    "AggregateFunction",
    "EventTimeSessionWindows",
    "OutputTag",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowedStream",
    "GlobalWindows",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
    "CountTrigger",
    "EventTimeTrigger",
    "ProcessingTimeTrigger",
    "ContinuousEventTimeTrigger",
    "PurgingTrigger",
    "Evictor",
    "CountEvictor",
    "TimeEvictor",
    "CheckpointConfig",
    "CheckpointingMode",
    "DataStream",
    "ExponentialBackoffRestart",
    "FailureHistory",
    "FailureRateRestart",
    "FixedDelayRestart",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListStateDescriptor",
    "LockgateError",
    "END_OF_TIME",
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "MapStateDescriptor",
    "NoRestart",
    "RestartStrategy",
    "Pipeline",
    "RestConfig",
    "AutoscalerConfig",
    "RuntimeContext",
    "ValueStateDescriptor",
    "StateTtlConfig",
    "UpdateType",
    "StateVisibility",
    "IncrementalCleanup",
    "TimeDomain",
    "WatermarkStrategy",
]
