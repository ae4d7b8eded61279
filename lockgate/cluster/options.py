"""How a job runs: the options of ``Pipeline.run``/``Pipeline.start`` and
``lockgate run``, in one keyword-only type that the job master keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockgate.api.result import Progress
from lockgate.checkpoint.kinds import CheckpointKind
from lockgate.config import RestConfig
from lockgate.errors import PipelineDefinitionError


@dataclass(kw_only=True)
class RunOptions:
    """The arguments of :meth:`lockgate.Pipeline.run` (documented there)."""

    launcher: str = "spark"
    from_checkpoint: str | None = None
    from_savepoint: str | None = None
    allow_non_restored_state: bool = False
    allow_non_replayable: bool | list[str] | tuple[str, ...] = False
    fault_injection: list[dict[str, Any]] | None = None
    job_id: str | None = None
    on_progress: Callable[[Progress], None] | None = None
    spark: Any = None
    master: str | None = None
    rest: RestConfig | bool | None = None
    progress: bool | None = False
    """Progress on stderr (``lockgate.cluster.progress``): ``Pipeline.run`` and
    ``lockgate run`` pass None (on unless ``LOCKGATE_PROGRESS=0``)."""
    fresh: bool = False
    """Start from nothing, even where an earlier run of the pipeline left
    checkpoints (without it the job resumes from them: :mod:`lockgate.cluster.resume`)."""
    resume_command: Callable[[str | None], str] | None = None
    """The command that resumes the job from a checkpoint (given) or runs it
    again (None), shown when Ctrl-C ends it; ``lockgate run`` sets it, else it
    is the ``python`` command line of this process."""
    resumed: bool = False
    """Set when the job resumes an earlier run of itself (not a start from a
    checkpoint or savepoint the user named)."""
    start_timeout: float = 120.0
    """Seconds an attempt's tasks have to start and register with the job
    master (the start-up watchdog); an attempt that takes longer fails, and
    the job restarts under its restart strategy."""
    bind_host: str = "127.0.0.1"
    """Set by the job master: the host the control server binds (tasks on
    other machines must reach it)."""

    def __post_init__(self) -> None:
        if not self.start_timeout > 0:
            raise PipelineDefinitionError(
                f"start_timeout must be > 0 seconds, got {self.start_timeout}")
        if self.from_checkpoint and self.from_savepoint:
            raise PipelineDefinitionError("give from_checkpoint or from_savepoint, not both")
        if self.launcher not in ("local", "spark"):
            raise PipelineDefinitionError(
                f"unknown launcher {self.launcher!r}; use 'local' or 'spark'")
        if self.launcher != "spark" and (self.spark is not None or self.master is not None):
            raise PipelineDefinitionError(
                f"a Spark session or master was given with launcher={self.launcher!r}; "
                "use launcher='spark' (the default) or drop them")

    @property
    def restore_from(self) -> str | None:
        """The checkpoint or savepoint the job starts from."""
        return self.from_checkpoint or self.from_savepoint

    @property
    def restore_kind(self) -> CheckpointKind:
        return CheckpointKind.SAVEPOINT if self.from_savepoint else CheckpointKind.CHECKPOINT
