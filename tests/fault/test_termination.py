"""Termination and savepoints under kills: two sources that finish at
different times, and a task killed while a savepoint is in progress."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lockgate import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    Pipeline,
    ValueStateDescriptor,
)
from lockgate.checkpoint import storage
from lockgate.connectors import FileSink, SequenceSource
from lockgate.errors import LockgateError
from tests.fault.checks import task_processes, wait_stopped
from tests.fault.held_source import HeldSequence
from tests.fault.sums_job import build, running_sums
from tests.fixtures import (
    check_exact_sums,
    check_running_sums,
    committed_lines,
    hidden_files,
    split_positions,
    start_and_await,
)


def _two_sources(tmp: Path, short: int, long: int) -> Pipeline:
    """Two independent keyed running-sum pipelines in one job; ``a`` ends long before ``b``."""
    p = Pipeline("two-sources", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")),
                 restart=FixedDelayRestart(max_attempts=5, delay_s=0.0))
    for name, n, rate in (("a", short, None), ("b", long, 20_000)):
        running_sums(p.source(SequenceSource(1, n, rate=rate), uid=f"numbers-{name}"), 3,
                     str(tmp / f"out-{name}"), suffix=f"-{name}")
    return p


def test_sources_finishing_at_different_times_with_a_kill_in_between(tmp_path: Path) -> None:
    """Source ``a`` ends first; checkpoints complete while ``b`` runs on (``a``'s
    whole output gets committed by them); then a task is SIGKILLed. After the
    restart ``a`` reads nothing again and ``b`` continues: both outputs exact."""
    short, long = 3_000, 100_000
    p = _two_sources(tmp_path, short, long)
    after_a = threading.Event()
    seen = {"checkpoints_after_a": 0}

    def on_progress(progress) -> None:
        if progress.restarts:
            return
        if len(committed_lines(tmp_path / "out-a")) == short:
            seen["checkpoints_after_a"] += 1
            if seen["checkpoints_after_a"] >= 2:  # checkpoints went on after a finished
                after_a.set()

    killed: dict[str, int] = {}

    def killer() -> None:
        if not after_a.wait(120):
            return
        victims = sorted(pid for pid, (attempt, _) in task_processes(os.getpid()).items()
                         if attempt == 0)
        os.kill(victims[-1], signal.SIGKILL)
        killed["pid"] = victims[-1]

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = p.run(launcher="local", on_progress=on_progress)
    thread.join(10)
    assert "pid" in killed, "source b ended before the kill (machine too slow?)"
    assert result.restarts == 1, result.failures
    check_exact_sums(tmp_path / "out-a", short, 3)
    check_exact_sums(tmp_path / "out-b", long, 3)
    assert result.records_in == short + long


def test_kill_during_a_savepoint(tmp_path: Path, launcher: str) -> None:
    """A task freezes (SIGSTOP) so a savepoint cannot complete, then dies
    (SIGKILL): the savepoint fails with a clear error, the job recovers, a
    new savepoint and a stop succeed, and resuming at another parallelism is exact."""
    n = 150_000
    # held: the job runs until the stop, however long the recovery takes
    p = build(n, 2, 4, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2, rate=40_000,
              held=True)
    checkpointed = threading.Event()
    restarted = threading.Event()

    def on_progress(progress) -> None:
        checkpointed.set()
        if progress.restarts:
            restarted.set()

    client = p.start(launcher=launcher, on_progress=on_progress)
    assert checkpointed.wait(120)
    tasks = task_processes(os.getpid())
    victim = max(pid for pid, (attempt, task) in tasks.items() if attempt == 0)
    os.kill(victim, signal.SIGSTOP)
    wait_stopped(victim)
    with ThreadPoolExecutor(1) as pool:
        attempt = pool.submit(client.savepoint, str(tmp_path / "sp"))
        # the savepoint is pending (the frozen task cannot acknowledge it)
        while not any(h["kind"] == "savepoint" for h in client.checkpoints()):
            threading.Event().wait(0.01)  # the request reaches the event loop within a tick
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(LockgateError, match="savepoint .* failed"):
            attempt.result(120)
    assert restarted.wait(120), "the job did not recover"
    sp = client.savepoint(str(tmp_path / "sp"))
    result = client.stop(str(tmp_path / "sp"))
    assert result.status == "stopped" and result.savepoint not in (None, sp)
    resumed = build(n, 3, 4, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    final = resumed.run(launcher=launcher, from_savepoint=result.savepoint)
    assert final.records_in == n
    check_exact_sums(tmp_path / "out", n, 4)


class _MarkAtFinish(KeyedProcessFunction):
    """Forwards every number; ``finish()`` adds one marker per subtask."""

    def process_element(self, value, ctx):
        return [value]

    def finish(self, ctx):
        return ["finished"]


def _finished_branch_job(tmp: Path, parallelism: int, short: int, long: int,
                         held: bool = False) -> Pipeline:
    """Branch ``a`` (bounded, short) ends early, with finish() markers; branch
    ``b`` runs on: the running sums of the other tests (``held``: until the
    job is stopped, see :class:`~tests.fault.held_source.HeldSequence`)."""
    numbers_b = (HeldSequence(1, long, rate=20_000) if held
                 else SequenceSource(1, long, rate=20_000))
    p = Pipeline("finished-branch", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")))
    (p.source(SequenceSource(1, short), uid="numbers-a")
       .key_by(lambda x: x % 3)
       .process(_MarkAtFinish(), uid="mark-a")
       .sink(FileSink(str(tmp / "out-a"), format="jsonl"), uid="out-a"))
    running_sums(p.source(numbers_b, uid="numbers-b"), 3,
                 str(tmp / "out-b"), suffix="-b")
    return p


@pytest.mark.parametrize("parallelism", [2])
def test_finished_operators_are_recorded_and_skipped_on_restore(tmp_path: Path,
                                                               parallelism: int) -> None:
    """FLIP-147: once every task of branch ``a`` has finished, checkpoints
    record its operators as finished; the job is stopped (no drain) and resumed
    at another parallelism: ``a`` reads nothing and its ``finish()`` does not run
    again (no second set of markers), while ``b`` continues exactly."""
    short, long = 600, 60_000
    client = start_and_await(
        _finished_branch_job(tmp_path, parallelism, short, long, held=True), launcher="local",
        until=lambda _: len(committed_lines(tmp_path / "out-a")) == short + parallelism,
        what="branch a's output was not committed")
    result = client.stop(str(tmp_path / "sp"))
    assert result.status == "stopped", result
    ops = storage.read_metadata(result.savepoint).operators
    assert {uid: op.finished for uid, op in ops.items()} == {
        "numbers-a": True, "mark-a": True, "out-a": True,
        "numbers-b": False, "pairs-b": False, "sums-b": False, "out-b": False}

    resumed = _finished_branch_job(tmp_path, 3, short, long)
    final = resumed.run(launcher="local", from_savepoint=result.savepoint)
    assert final.status == "finished"
    out_a = committed_lines(tmp_path / "out-a")
    assert sorted(x for x in out_a if x != "finished") == list(range(1, short + 1))
    assert out_a.count("finished") == parallelism  # finish() ran once per subtask, ever
    check_exact_sums(tmp_path / "out-b", long, 3)
    assert hidden_files(tmp_path / "out-a") == []


class _FinishAtGate(KeyedProcessFunction):
    """Forwards every number; ``finish()`` returns only once the file
    ``gate`` exists: the task cannot end its input before the test lets it."""

    def __init__(self, gate: str) -> None:
        self.gate = gate

    def process_element(self, value, ctx):
        return [value]

    def finish(self, ctx):
        while not os.path.exists(self.gate):
            time.sleep(0.05)
        return []


def test_a_stop_after_the_input_ended_is_refused_and_the_job_finishes(tmp_path: Path) -> None:
    """Every source read to its end, and a downstream task has not ended its
    input yet (its ``finish()`` waits for the test's gate): the final
    checkpoint is not triggered. A stop then is refused at once, saying the
    job finishes; no savepoint starts, and the job ends finished (not
    stopped), its output exact, once the gate opens."""
    n, gate = 2_000, tmp_path / "gate"
    p = Pipeline("finishing", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, n), uid="numbers")
       .key_by(lambda x: x % 3)
       .process(_FinishAtGate(str(gate)), uid="gated")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    client = p.start(launcher="local")
    try:
        deadline = time.monotonic() + 120
        coordinator = client.master.coordinator
        while not (coordinator.plan is not None  # the sources' end, as the job saw it
                   and coordinator.end_of_data >= set(coordinator.plan.source_tasks)):
            assert client.master.state == "running" and time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(LockgateError, match="is finishing: its input ended and its final "
                                                "checkpoint follows .*, so it is not stopped"):
            client.stop(str(tmp_path / "sp"), timeout=60)
    finally:
        gate.touch()
    result = client.result(timeout=120)
    assert result.status == "finished" and result.savepoint is None, result
    assert not (tmp_path / "sp").exists()  # no savepoint started
    assert [c.final for c in result.checkpoints if c.status == "completed"][-1]
    assert sorted(committed_lines(tmp_path / "out")) == list(range(1, n + 1))
    assert hidden_files(tmp_path / "out") == []


def test_drained_savepoint_records_nothing_as_finished(tmp_path: Path) -> None:
    """stop --drain ends the input artificially: the final savepoint records no
    operator as finished, so a job resumed from it reads on (and exactly)."""
    n = 60_000
    # held: the input cannot end before the drain, however slow the machine
    p = build(n, 2, 3, str(tmp_path / "out"), str(tmp_path / "chk"), 0.1, rate=20_000,
              held=True)
    client = start_and_await(p, launcher="local")
    result = client.stop(str(tmp_path / "sp"), drain=True)
    assert result.status == "finished", result
    meta = storage.read_metadata(result.savepoint)
    assert not any(op.finished for op in meta.operators.values()), meta.operators
    assert 0 < meta.progress.read < n
    resumed = build(n, 2, 3, str(tmp_path / "out"), str(tmp_path / "chk"), 0.1)
    final = resumed.run(launcher="local", from_savepoint=result.savepoint)
    assert final.records_in == n  # it read on from the savepoint, to the end
    check_running_sums(committed_lines(tmp_path / "out"), n, 3)


class _SumsThenMarker(KeyedProcessFunction):
    """Running sums per key; ``finish()`` adds one marker per subtask."""

    def open(self, ctx):
        self.sum = ctx.get_state(ValueStateDescriptor("sum", default=0))

    def process_element(self, value, ctx):
        total = self.sum.value() + value
        self.sum.update(total)
        return [(ctx.current_key, total)]

    def finish(self, ctx):
        return [("finished", ctx.task_index)]


def test_kill_after_the_final_checkpoint_completed(tmp_path: Path, launcher: str) -> None:
    """A task dies after the final checkpoint completed (its sinks committed
    everything), before the job ended. The next attempt restores that final
    checkpoint: it must take a final checkpoint of its own and end (not wait
    forever), and must not run ``finish()`` again (no second set of markers)."""
    n = 20_000
    p = Pipeline("final-kill", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")),
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0))
    (p.source(SequenceSource(1, n), uid="numbers")
       .key_by(lambda x: x % 3)
       .process(_SumsThenMarker(), uid="sums")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    # tasks 0-1: the sources; 2-3: sums -> out. Task 3 dies on the finish notice.
    client = p.start(launcher=launcher,
                     fault_injection=[{"point": "finish", "task": 3, "attempt": 0}])
    try:
        result = client.result(timeout=180)
    finally:
        if client.master.state == "running":
            client.cancel()
    assert result.status == "finished" and result.restarts == 1, result.failures
    final = [c for c in result.checkpoints if c.final]
    assert [c.status for c in final] == ["completed", "completed"]  # one per attempt
    out = committed_lines(tmp_path / "out")
    markers = sorted(r for r in out if r[0] == "finished")
    assert markers == [["finished", 0], ["finished", 1]]  # finish() ran once, ever
    check_running_sums([r for r in out if r[0] != "finished"], n, 3)
    assert hidden_files(tmp_path / "out") == []
    assert result.records_in == n


class _UnevenSequence(HeldSequence):
    """``1..n`` in two splits: split 0 holds only the first ``short`` numbers,
    so at parallelism 2 subtask 0 runs out long before subtask 1. ``held``:
    split 1 holds back its last number (split 0 ends: a partly finished
    source), so the job runs until it is stopped, however slow the machine."""

    def __init__(self, short: int, n: int, rate: float | None, held: bool) -> None:
        super().__init__(1, n, rate=rate)
        self.short = short
        self.held = held

    def splits(self, parallelism: int) -> list[dict]:
        assert parallelism == 2, "a fresh start of this test source takes 2 tasks"
        return [{"split": 0, "next": 1, "end": self.short, "step": 1},
                {"split": 1, "next": self.short + 1, "end": self.end, "step": 1}]

    def holds(self, split: dict) -> bool:
        return self.held and split["split"] == 1


def _uneven_job(tmp: Path, parallelism: int, n: int, rate: float | None,
                held: bool = False) -> Pipeline:
    p = Pipeline("uneven", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")),
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0))
    running_sums(p.source(_UnevenSequence(2_000, n, rate, held), uid="numbers"), 3,
                 str(tmp / "out"))
    return p


def test_partly_finished_source_keeps_its_running_tasks_state(tmp_path: Path) -> None:
    """Subtask 0 of the source runs out early, subtask 1 reads on: checkpoints
    complete in between, a task is SIGKILLed, and a stop with a savepoint
    records the source as NOT finished (one subtask still ran) with both
    positions (split 0 exhausted, split 1 part-read). Resumed at parallelism
    1, split 0 reads nothing again and split 1 reads on: the output is exact."""
    n = 100_000
    state = {"after_kill": 0}
    ready, resumed = threading.Event(), threading.Event()

    def on_progress(progress) -> None:
        if progress.restarts == 0 and progress.checkpoints_completed >= 5:
            ready.set()  # >= 0.5 s in: subtask 0 (2,000 records at 20,000/s) is done
        if progress.restarts:
            state["after_kill"] += 1
            if state["after_kill"] >= 2:
                resumed.set()

    client = _uneven_job(tmp_path, 2, n, 40_000, held=True).start(launcher="local",
                                                                  on_progress=on_progress)
    assert ready.wait(120), "no checkpoints completed"
    victim = max(pid for pid, (attempt, _) in task_processes(os.getpid()).items()
                 if attempt == 0)
    os.kill(victim, signal.SIGKILL)
    assert resumed.wait(120), "the job did not recover and checkpoint again"
    result = client.stop(str(tmp_path / "sp"))
    assert result.status == "stopped" and result.restarts == 1, result.failures
    meta = storage.read_metadata(result.savepoint)
    assert meta.operators["numbers"].finished is False
    positions = split_positions(result.savepoint)
    assert positions[0] == 2_001, "subtask 0 had not finished: the test proves nothing"
    assert 2_001 < positions[1] <= n, "subtask 1 had finished too: the test proves nothing"

    final = _uneven_job(tmp_path, 1, n, None).run(launcher="local",
                                                  from_savepoint=result.savepoint)
    assert final.status == "finished" and final.records_in == n
    check_exact_sums(tmp_path / "out", n, 3)
