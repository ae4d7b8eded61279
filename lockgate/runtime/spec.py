"""What a launcher needs to start a task: its :class:`TaskSpec`, and the
name a running task gives its process. Launchers and the driver import this,
never the task loop (:mod:`lockgate.runtime.task`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lockgate.checkpoint.metadata import CheckpointMetadata
from lockgate.config import DEFAULT_BUFFER_TIMEOUT
from lockgate.graph.jobgraph import JobVertex
from lockgate.state.backends import StateBackend


@dataclass
class TaskSpec:
    """Everything a task needs to run, besides the coordinator address and secret.
    Picklable (with cloudpickle, for the user's functions)."""

    job_id: str
    task_id: int
    vertex: JobVertex
    task_index: int
    max_parallelism: int
    attempt: int
    aligned: bool
    job_dir: str
    """The job's checkpoint folder: a local path or a URL every task can reach
    (:mod:`lockgate.fs`); with ``restore_dir``, all a task needs to find state."""
    inputs: list[list[int]]
    """Per input edge, the global numbers of the upstream tasks feeding this task."""
    outputs: list[list[int]]
    """Per output edge, the global numbers of all downstream tasks (by subtask index)."""
    restore_dir: str | None = None
    restore_metadata: CheckpointMetadata | None = None
    continues_final: bool = False
    """The restored checkpoint is the final one of an earlier job that ran to its
    end, and this job continues it (an incremental bounded run): every operator
    runs on from its end. Otherwise operators restored as finished are skipped,
    also after a failover to this job's own final checkpoint."""
    restore_committed: bool = False
    """The restored savepoint's sinks committed everything it names (its job
    ended after the commits): write-ahead sinks do not send it again."""
    allow_pickle: bool = False
    script_classes: list[type] = field(default_factory=list)
    """The classes of the job script the pipeline uses (sent by value): the
    task makes them picklable by name (:mod:`lockgate.state.script_classes`)."""
    batch_size: int = 1024
    buffer_timeout: float = DEFAULT_BUFFER_TIMEOUT
    """Seconds a record may wait in an output buffer (``Pipeline(buffer_timeout=...)``)."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    bind_host: str = "127.0.0.1"
    encrypt_traffic: bool = False
    """Seal every frame with AES-GCM (``CheckpointConfig.encrypt_traffic``)."""
    unaligned: bool = False
    """Unaligned checkpoints (``CheckpointConfig.unaligned``)."""
    aligned_timeout: float | None = None
    """Seconds a checkpoint stays aligned before it turns unaligned (None:
    unaligned from the start when ``unaligned``)."""
    max_data_frame: int = 256 << 20
    """Largest data frame this task sends or accepts (the driver's
    ``LOCKGATE_MAX_DATA_FRAME``, :func:`lockgate.runtime.wire.max_data_frame`)."""
    state_backend: StateBackend | None = None
    """The keyed state backend (``Pipeline(state_backend=...)``; None: heap)."""
    inline_threshold: int = 0
    """State files of at most this many bytes are kept in ``_metadata``
    (``CheckpointConfig.inline_threshold``)."""
    checkpoint_interval: float | None = None
    """Seconds between periodic checkpoints (None: none): when a state
    backend may expect the next one (the RocksDB backend's early flush)."""

    @property
    def name(self) -> str:
        return f"{self.vertex.name} ({self.task_index + 1}/{self.vertex.parallelism})"


TASK_PROCESS_PREFIX = "lgtask-"


def task_process_name(spec: TaskSpec) -> str:
    """What ``ps -o comm``/``top`` show for a running task: ``lgtask-<attempt>-<task>``
    (Linux keeps 15 characters)."""
    return f"{TASK_PROCESS_PREFIX}{spec.attempt}-{spec.task_id}"[:15]


@contextlib.contextmanager
def process_name(name: str) -> Iterator[None]:
    """Name this process ``name`` while the block runs (Linux ``/proc/self/comm``;
    elsewhere nothing), and give it its old name back after: a Spark Python
    worker runs other tasks afterwards."""
    try:
        with open("/proc/self/comm") as f:
            old = f.read().strip()
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        try:
            with open("/proc/self/comm", "w") as f:
                f.write(old)
        except OSError:
            pass
