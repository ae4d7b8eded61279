"""What the job master knows of one attempt's tasks (the part of Flink's
``ExecutionGraph`` this driver needs): :class:`TaskLayout`, which task runs
which operators (from the job graph; a rescale swaps it), and
:class:`AttemptTasks`, each task's state in the attempt as its events come
(registered, running, finished, its exit code and its last record counts).
Both are plain state, read and changed by the job master's loop only."""

from __future__ import annotations

from dataclasses import dataclass, field

from lockgate.checkpoint.metadata import Progress
from lockgate.graph.jobgraph import JobGraph


class TaskLayout:
    """The tasks of ``graph``: global task numbers, operators, sources."""

    def __init__(self, graph: JobGraph) -> None:
        self.num_tasks = graph.num_tasks
        offsets = graph.task_offsets()
        self.task_operators: dict[int, tuple[int, int, list[str]]] = {
            offsets[v.id] + i: (v.id, i, [op.uid for op in v.operators])
            for v in graph.vertices for i in range(v.parallelism)
        }
        """Per task: its vertex, its subtask index, its operators' uids."""
        self.source_tasks = [offsets[v.id] + i for v in graph.vertices if v.is_source
                             for i in range(v.parallelism)]

    def name(self, task: int) -> str:
        """How logs and failures name ``task``: ``a->b[i] (task n)``."""
        _, i, uids = self.task_operators[task]
        return f"{'->'.join(uids)}[{i}] (task {task})"


@dataclass
class AttemptTasks:
    """The tasks of one attempt, as the job master heard of them."""

    num_tasks: int
    registered: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Per task that registered: the host and port its peers connect to."""
    running: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    """Tasks that ended normally (their disconnection is no death)."""
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    """Exits the launcher saw of registered tasks (judged at their disconnection)."""
    records: dict[int, Progress] = field(default_factory=dict)
    """Per task: the records it read and wrote, as it last reported."""

    @property
    def all_registered(self) -> bool:
        return len(self.registered) == self.num_tasks

    @property
    def all_running(self) -> bool:
        return len(self.running) == self.num_tasks

    @property
    def all_finished(self) -> bool:
        return len(self.finished) >= self.num_tasks

    def missing(self) -> list[int]:
        """Tasks not registered yet."""
        return [t for t in range(self.num_tasks) if t not in self.registered]

    def count(self, task: int, read: int, written: int) -> None:
        """Records read by ``task`` (a source) and written (a sink), in this
        attempt: after a restart, counts start again from the restored positions."""
        self.records[task] = Progress(read, written)

    def totals(self, baseline: Progress) -> Progress:
        """Records read and written since the job started: ``baseline`` (the
        restored checkpoint's counts) plus what the tasks last reported."""
        counts = self.records.values()
        return Progress(baseline.read + sum(c.read for c in counts),
                        baseline.written + sum(c.written for c in counts))
