"""Savepoints: taken while a job runs, stop with and without drain, resume at
another parallelism, relocated, refused when they do not fit — with the
exact-output check of the fault suite holding across every hop."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from lockgate import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    ListStateDescriptor,
    Pipeline,
    ValueStateDescriptor,
)
from lockgate.checkpoint import storage
from lockgate.connectors import FileSink, SequenceSource
from lockgate.errors import CheckpointCorruptError, JobFailedError, LockgateError
from tests.fault.checks import task_processes
from tests.fault.held_source import HeldSequence
from tests.fault.sums_job import build
from tests.fixtures import (
    check_exact_sums,
    committed_lines,
    hidden_files,
    operator_state,
    start_and_await,
    visible_files,
)

N = 200_000
KEYS = 5


def _start(tmp: Path, parallelism: int, launcher: str, **kwargs):
    """Start the sums job; return its client once its first checkpoint
    completed. Its source holds the last number of every split back: the job
    runs until it is stopped, however slow the machine (a stop that came
    after the end of the input would find the job finished); a job resumed
    from its savepoint with the plain source reads the rest."""
    p = build(N, parallelism, KEYS, str(tmp / "out"), str(tmp / "chk"), 0.2, rate=40_000,
              held=True)
    return start_and_await(p, launcher=launcher, **kwargs)


def _hop(tmp: Path, parallelism: int, launcher: str, drain: bool, savepoint: str | None):
    client = _start(tmp, parallelism, launcher, from_savepoint=savepoint)
    result = client.stop(dir=str(tmp / "savepoints"), drain=drain)
    assert result.status == ("finished" if drain else "stopped"), result
    assert result.savepoint is not None
    meta = storage.read_metadata(result.savepoint)
    assert meta.kind == "savepoint"
    assert meta.operators["sums"].parallelism == parallelism
    if drain:  # the final savepoint made the sinks commit everything
        assert hidden_files(tmp / "out") == []
    return result


def test_stop_with_savepoint_and_rescale_is_exact(tmp_path: Path, launcher: str) -> None:
    """p=2 -stop-> 1 -stop --drain-> 3 -stop-> 4 -stop-> 2 (runs to the end):
    down, up twice, and back; every record's running sum is committed exactly
    once across the five jobs."""
    r1 = _hop(tmp_path, 2, launcher, drain=False, savepoint=None)
    r2 = _hop(tmp_path, 1, launcher, drain=True, savepoint=r1.savepoint)
    r3 = _hop(tmp_path, 3, launcher, drain=False, savepoint=r2.savepoint)
    r4 = _hop(tmp_path, 4, launcher, drain=False, savepoint=r3.savepoint)
    p = build(N, 2, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    final = p.run(launcher=launcher, from_savepoint=r4.savepoint)
    assert final.status == "finished"
    assert final.records_in == N and final.records_out == N
    check_exact_sums(tmp_path / "out", N, KEYS)
    # savepoints are never deleted by Lockgate
    for r in (r1, r2, r3, r4):
        assert storage.read_metadata(r.savepoint).kind == "savepoint"


def test_intermediate_savepoint_commits_nothing_and_moves(tmp_path: Path) -> None:
    """A savepoint taken while the job goes on: the job's next checkpoint
    commits the sink's work; the savepoint folder, moved elsewhere, restores."""
    client = _start(tmp_path, 2, "local")
    path = client.savepoint(dir=str(tmp_path / "sp"))
    history = client.checkpoints()
    assert any(h["kind"] == "savepoint" and h["status"] == "completed" for h in history)
    result = client.stop(dir=str(tmp_path / "sp"))
    assert result.status == "stopped"
    # move the stop's savepoint elsewhere and resume from it: still exact
    moved = tmp_path / "elsewhere" / "sp-moved"
    moved.parent.mkdir()
    shutil.move(result.savepoint, moved)
    p = build(N, 2, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    final = p.run(launcher="local", from_savepoint=str(moved))
    assert final.records_in == N
    check_exact_sums(tmp_path / "out", N, KEYS)
    assert storage.read_metadata(path).kind == "savepoint"


def test_failure_after_intermediate_savepoints_rolls_back_past_them(tmp_path: Path) -> None:
    """No periodic checkpoints: intermediate savepoints make the sink commit
    nothing (no visible file), and a task SIGKILLed after them restarts the job
    from the beginning, never from a savepoint. The output is still exact: the
    savepoints' pre-committed files were never made visible, and were removed."""
    p = build(N, 2, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), None, rate=40_000)
    client = p.start(launcher="local")
    savepoints = []
    while len(savepoints) < 2 or storage.read_metadata(savepoints[-1]).progress.read == 0:
        assert len(savepoints) < 200, "no record was read before the savepoints"
        savepoints.append(client.savepoint(dir=str(tmp_path / "sp")))
    assert visible_files(tmp_path / "out") == {}
    assert any(f.name.endswith(".pending") for f in (tmp_path / "out").iterdir()), \
        "the savepoints pre-committed nothing: the test would prove nothing"
    victim = max(pid for pid, (attempt, _) in task_processes(os.getpid()).items() if attempt == 0)
    os.kill(victim, signal.SIGKILL)
    result = client.result(timeout=300)
    assert result.status == "finished" and result.restarts == 1, result.failures
    assert not any(c.status == "completed" and c.kind == "checkpoint" and not c.final
               for c in result.checkpoints)
    check_exact_sums(tmp_path / "out", N, KEYS)
    assert result.records_in == N


def test_unknown_uid_in_savepoint_is_refused_unless_allowed(tmp_path: Path) -> None:
    client = _start(tmp_path, 2, "local")
    sp = client.stop(dir=str(tmp_path / "sp")).savepoint
    assert sp is not None
    before = sorted(f.name for f in (tmp_path / "out").iterdir())
    # the new code renamed the reduce: its old state has nowhere to go
    p = build(N, 2, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    for node in p.nodes:
        if node.uid == "sums":
            node.uid = "sums-v2"
    with pytest.raises(CheckpointCorruptError) as info:
        p.run(launcher="local", from_savepoint=sp)
    message = str(info.value)
    assert "'sums'" in message and "allow_non_restored_state" in message
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == before  # nothing touched
    # allowed: the renamed operator starts empty, the rest restores
    result = p.run(launcher="local", from_savepoint=sp, allow_non_restored_state=True)
    assert result.status == "finished" and result.records_in == N


def test_a_moved_sink_or_another_jobs_savepoint_is_refused_saying_what_differs(
        tmp_path: Path) -> None:
    """A savepoint names its job and where each sink wrote: restored into a
    job whose sink writes elsewhere (the folder changed, or it is another
    job's savepoint), the restore says what differs and how to go on, fails
    at once, and touches nothing; the advice (a new sink uid,
    allow_non_restored_state) works."""
    client = _start(tmp_path, 2, "local")
    sp = client.stop(dir=str(tmp_path / "sp")).savepoint
    assert sp is not None
    meta = storage.read_metadata(sp)
    assert meta.job_name == "sums"
    assert meta.operators["out"].location == str(tmp_path / "out")
    before = sorted(f.name for f in (tmp_path / "out").iterdir())
    # the stop committed them, and the savepoint still names them (a resumed
    # job commits them again, idempotently, where they are)
    assert any(operator_state(sp, "out")), "no transaction in the savepoint: proves nothing"
    moved = build(N, 2, KEYS, str(tmp_path / "out2"), str(tmp_path / "chk"), 0.2)
    with pytest.raises(JobFailedError) as info:
        moved.run(launcher="local", from_savepoint=sp)
    message = str(info.value)
    assert "SavepointMismatchError" in message and "Restarting cannot help" in message
    assert f"file sink 'out' wrote to {tmp_path / 'out'}" in message
    assert f"now writes to {tmp_path / 'out2'}" in message
    assert "new uid" in message and "--allow-non-restored-state" in message
    assert "committed output was lost" not in message
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == before  # nothing touched
    # another job's savepoint: both jobs are named
    other = build(N, 2, KEYS, str(tmp_path / "out3"), str(tmp_path / "chk"), 0.2)
    other.name = "totals"
    with pytest.raises(JobFailedError, match=r"savepoint of job 'sums' \(sums-.*'totals'"):
        other.run(launcher="local", from_savepoint=sp)
    # the advice: a new sink uid, and the old sink's state dropped
    for node in moved.nodes:
        if node.uid == "out":
            node.uid = "out-v2"
    result = moved.run(launcher="local", from_savepoint=sp, allow_non_restored_state=True)
    assert result.status == "finished" and result.records_in == N
    assert committed_lines(tmp_path / "out2")
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == before


def test_savepoint_without_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    client = _start(tmp_path, 1, "local")
    with pytest.raises(LockgateError, match="no savepoint folder"):
        client.savepoint()
    assert client.cancel().status == "cancelled"


class CountV1(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        self.count.update(self.count.value() + 1)
        yield (ctx.current_key, self.count.value())


class CountV2(KeyedProcessFunction):
    """New code: the same state name, now a list."""

    def open(self, ctx):
        self.count = ctx.get_list_state(ListStateDescriptor("count"))

    def process_element(self, value, ctx):
        self.count.add(value)
        yield (ctx.current_key, len(list(self.count.get())))


def _counting(tmp: Path, fn: KeyedProcessFunction, n: int, rate: float | None,
              held: bool = False) -> Pipeline:
    """``held``: the job runs until it is stopped (see :func:`_start`)."""
    p = Pipeline("counts", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")),
                 restart=FixedDelayRestart(max_attempts=1, delay_s=0.0))
    source = HeldSequence(1, n, rate=rate) if held else SequenceSource(1, n, rate=rate)
    (p.source(source, uid="numbers")
       .key_by(lambda x: x % 7)
       .process(fn, uid="counter")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def test_changed_state_type_is_refused_naming_both_types(tmp_path: Path) -> None:
    client = start_and_await(_counting(tmp_path, CountV1(), 100_000, 20_000, held=True),
                             launcher="local")
    sp = client.stop(dir=str(tmp_path / "sp")).savepoint
    before = sorted(f.name for f in (tmp_path / "out").iterdir() if not f.name.startswith("."))
    with pytest.raises(JobFailedError) as info:
        _counting(tmp_path, CountV2(), 100_000, None).run(launcher="local", from_savepoint=sp)
    message = str(info.value)
    assert "'count'" in message and "value" in message and "list" in message, message
    assert "counter" in message  # the operator uid
    assert "Restarting cannot help" in message  # fatal: no restart loop
    after = sorted(f.name for f in (tmp_path / "out").iterdir() if not f.name.startswith("."))
    assert after == before  # nothing committed was lost or added


def _state_file_of(savepoint: Path, uid: str) -> Path:
    """The operator's largest state file (a subtask may hold no key)."""
    return max(savepoint.glob(f"{uid}-*.state"), key=lambda f: f.stat().st_size)


@pytest.mark.parametrize("damage", ["metadata garbage", "keyed state truncated",
                                    "sink state deleted"])
def test_corrupt_savepoint_is_refused_and_committed_output_kept(tmp_path: Path,
                                                                damage: str) -> None:
    client = _start(tmp_path, 2, "local")
    sp = Path(client.stop(dir=str(tmp_path / "sp")).savepoint)
    output = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()}
    if damage == "metadata garbage":
        named = sp / "_metadata"
        named.write_bytes(named.read_bytes()[:40] + b"\x00garbage")
        words = "is corrupt"
    elif damage == "keyed state truncated":
        named = _state_file_of(sp, "sums")
        named.write_bytes(named.read_bytes()[:-7])
        words = "it is truncated or damaged"
    else:
        named = _state_file_of(sp, "out")
        named.unlink()
        words = "is missing"
    p = build(N, 3, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    with pytest.raises(CheckpointCorruptError) as info:
        p.run(launcher="local", from_savepoint=str(sp))
    assert str(named) in str(info.value) and words in str(info.value), info.value
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()} == output


def test_inspect_of_an_incremental_checkpoint_names_the_owned_key_groups(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An incremental (RocksDB) checkpoint holds its tasks' files, not key-group
    blocks: inspect shows the key-group range each task owned, marked as such,
    and the bytes of the shared files it references."""
    from lockgate.cli.savepoint import describe_savepoint, print_savepoint

    p = Pipeline("inc", parallelism=2, state_backend="rocksdb",
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 20_000, rate=40_000), uid="numbers")
        .key_by(lambda x: x % 50)
        .reduce(lambda a, b: a + b, uid="sums")
        .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    result = p.run(launcher="local")
    assert result.latest_checkpoint is not None
    info = describe_savepoint(result.latest_checkpoint)
    sums = {o["uid"]: o for o in info["operators"]}["sums"]
    assert sums["incremental"] and sums["key_groups"] == info["max_parallelism"]
    assert all(s["incremental"] and s["key_groups"] for s in sums["subtasks"])
    assert sum(s["shared_bytes"] for s in sums["subtasks"]) > 0
    print_savepoint(result.latest_checkpoint, as_json=False)
    assert f"{info['max_parallelism']} owned (incremental)" in capsys.readouterr().out
