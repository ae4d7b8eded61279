"""The job master's view of an attempt's tasks, alone: which task runs
which operators (``TaskLayout``), and each task's state and counts as its
events come (``AttemptTasks``)."""

from __future__ import annotations

from lockgate import Pipeline
from lockgate.checkpoint.metadata import Progress
from lockgate.cluster.attempt import AttemptTasks, TaskLayout
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.graph.jobgraph import build_job_graph
from lockgate.graph.rescale import rescaled


def graph():
    p = Pipeline("g", parallelism=2)
    (p.source(SequenceSource(1, 10), uid="src").map(str, uid="m")
       .key_by(len).reduce(max, uid="r").sink(CollectSink(), uid="out"))
    return build_job_graph(p)


def test_the_layout_numbers_tasks_vertex_by_vertex_and_names_them():
    layout = TaskLayout(graph())
    assert layout.num_tasks == 4 and layout.source_tasks == [0, 1]
    assert layout.task_operators == {0: (0, 0, ["src", "m"]), 1: (0, 1, ["src", "m"]),
                                     2: (1, 0, ["r", "out"]), 3: (1, 1, ["r", "out"])}
    assert layout.name(3) == "r->out[1] (task 3)"


def test_a_rescaled_graphs_layout_has_its_tasks():
    layout = TaskLayout(rescaled(graph(), None, {"r": 3}))
    assert layout.num_tasks == 5 and layout.source_tasks == [0, 1]
    assert layout.name(4) == "r->out[2] (task 4)"


def test_an_attempts_tasks_register_run_and_finish():
    tasks = AttemptTasks(3)
    tasks.registered[0] = ("h", 1)
    tasks.registered[2] = ("h", 3)
    assert not tasks.all_registered and tasks.missing() == [1]
    tasks.registered[1] = ("h", 2)
    assert tasks.all_registered and tasks.missing() == []
    tasks.running.update({0, 1})
    assert not tasks.all_running
    tasks.running.add(2)
    assert tasks.all_running and not tasks.all_finished
    tasks.finished.update({0, 1, 2})
    assert tasks.all_finished


def test_totals_add_each_tasks_last_counts_to_the_restored_baseline():
    tasks = AttemptTasks(2)
    assert tasks.totals(Progress(100, 7)) == Progress(100, 7)
    tasks.count(0, 10, 0)
    tasks.count(1, 0, 4)
    tasks.count(0, 25, 0)  # a later report replaces the earlier one
    assert tasks.totals(Progress(100, 7)) == Progress(125, 11)
