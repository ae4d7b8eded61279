"""What each task of an attempt is started with: its :class:`TaskSpec`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.api.plan import Partitioning
from lockgate.cluster.coordinator import CompletedCheckpoint
from lockgate.graph.jobgraph import JobGraph
from lockgate.runtime.spec import TaskSpec
from lockgate.runtime.wire import max_data_frame

if TYPE_CHECKING:
    from lockgate.api.pipeline import Pipeline


def task_specs(graph: JobGraph, job_id: str, job_dir: str, attempt: int, pipeline: Pipeline,
               *, aligned: bool, restore: CompletedCheckpoint | None, continues_final: bool,
               script_classes: list[type], faults: list[dict[str, Any]]) -> list[TaskSpec]:
    """One spec per task, numbered globally (``graph.task_offsets()``): its
    vertex and subtask index, the global numbers of the tasks on each of its
    input and output edges, and the checkpoint it restores (``restore``)."""
    offsets = graph.task_offsets()
    specs = []
    for v in graph.vertices:
        for i in range(v.parallelism):
            inputs = [
                [offsets[e.upstream] + i] if e.partitioning == Partitioning.FORWARD
                else [offsets[e.upstream] + j for j in range(e.upstream_parallelism)]
                for e in v.inputs
            ]
            outputs = [[offsets[e.downstream] + j for j in range(e.downstream_parallelism)]
                       for e in v.outputs]
            specs.append(TaskSpec(
                job_id=job_id, task_id=offsets[v.id] + i, vertex=v, task_index=i,
                max_parallelism=graph.max_parallelism, attempt=attempt, aligned=aligned,
                job_dir=str(job_dir), inputs=inputs, outputs=outputs,
                restore_dir=str(restore.path) if restore else None,
                restore_metadata=restore.metadata if restore else None,
                continues_final=continues_final,
                restore_committed=restore is not None and restore.sinks_committed,
                allow_pickle=pipeline.allow_pickle,
                state_backend=pipeline.state_backend,
                script_classes=script_classes,
                batch_size=pipeline.batch_size,
                buffer_timeout=pipeline.buffer_timeout,
                faults=list(faults),
                encrypt_traffic=pipeline.checkpoint.encrypt_traffic,
                unaligned=aligned and pipeline.checkpoint.unaligned,
                aligned_timeout=pipeline.checkpoint.aligned_timeout,
                max_data_frame=max_data_frame(),
                checkpoint_interval=pipeline.checkpoint.interval,
                inline_threshold=pipeline.checkpoint.inline_threshold,
            ))
    return specs
