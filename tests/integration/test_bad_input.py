"""Bad input: a checkpoint directory with a corrupt or missing ``_metadata``, a
truncated state file, an unwritable sink folder, a user function that raises —
each gives a clear error and loses nothing that was committed.

Real task processes (``local`` launcher) and real files throughout. Functions
and classes the tasks run are defined at module level, so the task processes
import them from this module.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lockgate import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    NoRestart,
    Pipeline,
    RuntimeContext,
    ValueStateDescriptor,
)
from lockgate.api.result import Progress
from lockgate.checkpoint import storage
from lockgate.connectors import CollectSink, FileSink, SequenceSource, Sink, TaskInfo
from lockgate.connectors.sequence import SequenceReader
from lockgate.errors import (
    CheckpointCorruptError,
    ConfigurationError,
    JobFailedError,
    PipelineDefinitionError,
)
from tests.fault.sums_job import build as build_sums
from tests.fixtures import (
    check_exact_sums,
    check_running_sums,
    committed_lines,
    hidden_files,
    visible_files,
)

LAUNCHER = "local"  # explicit: the default launcher may change
N = 4000
KEYS = 3


# ------------------------------------------------ damaged checkpoints


@dataclass(frozen=True)
class FinishedRun:
    """A bounded running-sums job that ran to its end: its committed output and
    its retained checkpoints (the newest one is the final checkpoint)."""

    out: Path
    job_dir: Path
    latest: Path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    base = tmp_path_factory.mktemp("finished")
    out = base / "out"
    result = build_sums(N, 2, KEYS, str(out), str(base / "chk"), 0.2).run(launcher=LAUNCHER)
    check_running_sums(committed_lines(out), N, KEYS)
    assert result.latest_checkpoint is not None
    latest = Path(result.latest_checkpoint)
    return FinishedRun(out, latest.parent, latest)


@dataclass(frozen=True)
class Copy:
    out: Path
    checkpoint: Path
    output: dict[str, bytes]
    """The committed output before anything was tried."""


@pytest.fixture
def copy(finished_run: FinishedRun, tmp_path: Path) -> Copy:
    """A private copy of the finished run's sink folder and checkpoints, to damage."""
    out = tmp_path / "out"
    shutil.copytree(finished_run.out, out)
    job_dir = tmp_path / "chk" / finished_run.job_dir.name
    shutil.copytree(finished_run.job_dir, job_dir)
    return Copy(out, job_dir / finished_run.latest.name, visible_files(out))


def _state_file(chk: Path, uid: str) -> Path:
    """The largest state file of operator ``uid`` in checkpoint ``chk``."""
    handles = [h for h in storage.read_metadata(chk).operators[uid].subtasks if h]
    handle = max(handles, key=lambda h: h.size)
    path = chk / handle.file
    assert path.stat().st_size == handle.size > 0
    return path


def _remove_metadata(chk: Path) -> Path:
    (chk / "_metadata").unlink()
    return chk


def _garbage_metadata(chk: Path) -> Path:
    (chk / "_metadata").write_bytes(b"\x00\xff\xfe garbage \x13\x37")
    return chk / "_metadata"


def _cut_metadata(chk: Path) -> Path:
    data = (chk / "_metadata").read_bytes()
    (chk / "_metadata").write_bytes(data[: len(data) // 2])
    return chk / "_metadata"


def _foreign_metadata(chk: Path) -> Path:
    (chk / "_metadata").write_text('{"format": 99, "checkpoint_id": 1}')
    return chk / "_metadata"


def _truncate_keyed_state(chk: Path) -> Path:
    path = _state_file(chk, "sums")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _truncate_sink_state(chk: Path) -> Path:
    path = _state_file(chk, "out")
    path.write_bytes(path.read_bytes()[:-1])
    return path


def _delete_source_state(chk: Path) -> Path:
    path = _state_file(chk, "numbers")
    path.unlink()
    return path


def _remove_folder(chk: Path) -> Path:
    shutil.rmtree(chk)
    return chk


DAMAGE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "metadata missing": (_remove_metadata, "has no _metadata: that checkpoint never completed"),
    "metadata garbage": (_garbage_metadata, "is corrupt"),
    "metadata truncated": (_cut_metadata, "is corrupt"),
    "metadata of another format": (_foreign_metadata, "is not a Lockgate checkpoint"),
    "keyed state truncated": (_truncate_keyed_state, "it is truncated or damaged"),
    "sink state one byte short": (_truncate_sink_state, "it is truncated or damaged"),
    "source state deleted": (_delete_source_state, "is missing: the checkpoint is damaged"),
    "checkpoint folder gone": (_remove_folder, "does not exist"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_is_refused_and_committed_output_kept(
        copy: Copy, tmp_path: Path, damage: str) -> None:
    harm, words = DAMAGE[damage]
    named = harm(copy.checkpoint)
    p = build_sums(N, 2, KEYS, str(copy.out), str(tmp_path / "chk-new"), 0.2)
    with pytest.raises(CheckpointCorruptError) as e:
        p.run(launcher=LAUNCHER, from_checkpoint=str(copy.checkpoint))
    assert str(named) in str(e.value) and words in str(e.value)
    # advice that would break exactly-once says so, and how to stay exact
    if "earlier checkpoint" in str(e.value):
        assert "not exactly-once" in str(e.value) and "new uids" in str(e.value)
    assert visible_files(copy.out) == copy.output
    assert hidden_files(copy.out) == []


def test_state_file_damaged_at_same_size_fails_the_job_at_once(
        copy: Copy, tmp_path: Path) -> None:
    """Same size, other bytes: only the CRC-32 check in the restoring task sees
    it. The job fails at once (a restart cannot help) and names the file."""
    path = _state_file(copy.checkpoint, "sums")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    p = build_sums(N, 2, KEYS, str(copy.out), str(tmp_path / "chk-new"), 0.2)
    with pytest.raises(JobFailedError) as e:
        p.run(launcher=LAUNCHER, from_checkpoint=str(copy.checkpoint))
    msg = str(e.value)
    assert "CheckpointCorruptError" in msg and str(path) in msg, msg
    assert "Restarting cannot help" in msg
    assert visible_files(copy.out) == copy.output


# ---------------------------------------------------- unwritable sink folder


class MarkedSequence(SequenceSource):
    """A ``SequenceSource`` that leaves a file behind when a task opens it."""

    def __init__(self, start: int, end: int, *, marker: str) -> None:
        super().__init__(start, end)
        self.marker = marker

    def create_reader(self, info: TaskInfo) -> SequenceReader:
        Path(self.marker).touch()
        return super().create_reader(info)


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An existing folder nobody can write: mode 0o500, and for root (which
    ignores modes) the immutable attribute as well."""
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    immutable = os.geteuid() == 0
    if immutable:
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"running as root and chattr +i is not available: {done.stderr}")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def _folder(case: str, tmp_path: Path, read_only_folder: Path) -> Path:
    if case == "read-only":
        return read_only_folder
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    return a_file if case == "a file" else a_file / "out"


@pytest.mark.parametrize("sink_type", ["FileSink", "CollectSink"])
@pytest.mark.parametrize("case", ["read-only", "a file", "under a file"])
def test_unwritable_sink_folder_fails_in_the_driver(
        tmp_path: Path, read_only_folder: Path, case: str, sink_type: str) -> None:
    folder = _folder(case, tmp_path, read_only_folder)
    marker = tmp_path / "a-task-started"
    sink: Sink[Any] = (FileSink(str(folder)) if sink_type == "FileSink"
                       else CollectSink(str(folder)))
    p = Pipeline("unwritable", parallelism=2, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    p.source(MarkedSequence(1, 100, marker=str(marker)), uid="numbers").sink(sink, uid="out")
    with pytest.raises(ConfigurationError) as e:
        p.run(launcher=LAUNCHER)
    msg = str(e.value)
    assert f"file sink folder {str(folder)!r}" in msg, msg
    assert "not writable" in msg or "not a directory" in msg or "cannot be created" in msg
    assert not marker.exists(), "a task started before the folder was checked"


# ------------------------------------------------- a user function raises


class GatedSequence(SequenceSource):
    """A bounded ``SequenceSource`` whose every task emits only the first
    ``before`` numbers of its split until the file ``gate`` exists (``None``:
    no gate). Until then the task idles, so checkpoints go on."""

    def __init__(self, start: int, end: int, *, before: int, gate: str | None) -> None:
        super().__init__(start, end)
        self.before = before
        self.gate = gate

    def create_reader(self, info: TaskInfo) -> SequenceReader:
        return GatedReader(self, info)


class GatedReader(SequenceReader):
    def __init__(self, source: GatedSequence, info: TaskInfo) -> None:
        super().__init__(source, info)
        self.gate = source.gate
        self.limit = int(source.splits(info.parallelism)[info.task_index]["next"]) + source.before

    def poll(self, max_records: int) -> list[int] | None:
        if self.gate is not None and not os.path.exists(self.gate):
            room = self.limit - int(self.splits[0]["next"])
            if room <= 0:
                return []  # nothing available now
            max_records = min(max_records, room)
        return super().poll(max_records)


POISON = 3500  # in the second split (2001..4000), after its first BEFORE numbers
BEFORE = 1000


def poison(x: int) -> int:
    if x == POISON:
        raise ValueError(f"cannot digest {x}")
    return x


def identity(x: int) -> int:
    return x


def pair(x: int) -> tuple[int, int]:
    return (x % KEYS, x)


def key(kv: tuple[int, int]) -> int:
    return kv[0]


def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def _sums(tmp_path: Path, check: Callable[[int], int], gate: str | None) -> Pipeline:
    p = Pipeline("poison", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")),
                 restart=FixedDelayRestart(max_attempts=1, delay_s=0.0))
    (p.source(GatedSequence(1, N, before=BEFORE, gate=gate), uid="numbers")
       .map(check, uid="check")
       .map(pair, uid="pairs")
       .key_by(key)
       .reduce(add, uid="sums")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    return p


def check_consistent_prefix(records: list[list[int]], n: int, keys: int,
                            parallelism: int) -> set[int]:
    """Committed output of a running-sums job that stopped early. Per key the
    committed sums are that key's first running sums: their successive
    differences are distinct inputs of that key. Over all keys the inputs
    covered are, in every source split, a prefix of the split (the cut of a
    checkpoint). Returns the inputs covered."""
    sums: dict[int, list[int]] = defaultdict(list)
    for k, s in records:
        sums[k].append(s)
    covered: list[int] = []
    for k, got in sums.items():
        got.sort()
        diffs = [b - a for a, b in zip([0, *got], got, strict=False)]
        assert all(1 <= d <= n and d % keys == k for d in diffs), f"key {k}: not running sums"
        covered += diffs
    assert len(covered) == len(set(covered)), "an input was committed twice"
    cov = set(covered)
    for split in SequenceSource(1, n).splits(parallelism):
        numbers = range(split["next"], split["end"] + 1)
        taken = [x for x in numbers if x in cov]
        assert taken == list(numbers[: len(taken)]), f"split {split} is not cut at a prefix"
    return cov


def test_user_function_raising_fails_the_job_and_keeps_committed_output(
        tmp_path: Path) -> None:
    """The source holds back all but its first BEFORE numbers per task until a
    checkpoint holding them has completed; then the ``check`` map meets its
    poison record. One restart is allowed: it restores that checkpoint and meets
    the poison again, and the job fails naming the operator and the exception."""
    gate = tmp_path / "gate"

    def open_gate(progress: Progress) -> None:
        if progress.records_written >= 2 * BEFORE:  # a checkpoint holds every early sum
            gate.touch()

    with pytest.raises(JobFailedError) as e:
        _sums(tmp_path, poison, str(gate)).run(launcher=LAUNCHER, job_id="poison",
                                                on_progress=open_gate)
    msg = str(e.value)
    assert "after 2 failure(s)" in msg, msg  # max_attempts=1: one restart, then give up
    assert f"UserFunctionError: operator 'check' raised ValueError: cannot digest {POISON}" in msg

    # What is visible is exactly a checkpoint's cut, and holds at least the
    # checkpoint the restart restored (its sink committed it before any record).
    out = tmp_path / "out"
    covered = check_consistent_prefix(committed_lines(out), N, KEYS, 2)
    early = set(range(1, BEFORE + 1)) | set(range(N // 2 + 1, N // 2 + BEFORE + 1))
    assert early <= covered and POISON not in covered

    # Nothing committed is lost: the latest checkpoint resumes to the exact result.
    latest = storage.latest_completed(tmp_path / "chk" / "poison")
    assert latest is not None
    result = _sums(tmp_path, identity, None).run(launcher=LAUNCHER,
                                                 from_checkpoint=str(latest))
    check_exact_sums(out, N, KEYS)
    assert (result.restarts, result.records_in, result.records_out) == (0, N, N)


# -------------------------------------------------- unserializable state


class Opaque:
    """Not a type the safe state codec knows."""

    def __init__(self, n: int) -> None:
        self.n = n


class KeepOpaque(KeyedProcessFunction[int, tuple[int, int]]):
    """Keeps an ``Opaque`` in the given kind of state; emits ``(key, n)`` with
    ``n`` read back from state."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def open(self, ctx: RuntimeContext) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("last"))
        self.list = ctx.get_list_state(ListStateDescriptor("all"))
        self.map = ctx.get_map_state(MapStateDescriptor("by-parity"))

    def process_element(self, value: int, ctx: RuntimeContext) -> Iterable[tuple[int, int]]:
        if self.kind == "value":
            self.value.update(Opaque(value))
            kept = self.value.value()
        elif self.kind == "list":
            self.list.add(Opaque(value))
            kept = self.list.get()[-1]
        else:
            self.map.put(value % 2, Opaque(value))
            kept = self.map.get(value % 2)
        return [(ctx.current_key, kept.n)]


def _opaque(tmp_path: Path, kind: str, allow_pickle: bool) -> tuple[Pipeline, CollectSink]:
    sink = CollectSink(str(tmp_path / "collect"))
    p = Pipeline("opaque", parallelism=2, allow_pickle=allow_pickle, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 1000), uid="numbers")
       .key_by(lambda x: x % 5)
       .process(KeepOpaque(kind), uid="keep")
       .sink(sink, uid="out"))
    return p, sink


@pytest.mark.parametrize("kind", ["value", "list", "map"])
def test_unserializable_state_names_the_type_and_the_opt_in(tmp_path: Path, kind: str) -> None:
    p, sink = _opaque(tmp_path, kind, allow_pickle=False)
    with pytest.raises(JobFailedError) as e:
        p.run(launcher=LAUNCHER)
    msg = str(e.value)
    assert "StateSerializationError" in msg and "keep" in msg, msg
    assert f"type {__name__}.Opaque in state without pickle" in msg
    assert "Pipeline(..., allow_pickle=True)" in msg
    assert "Restarting cannot help" in msg
    assert sink.results() == []  # no checkpoint completed: nothing became visible


def test_pickled_state_runs_with_the_opt_in_and_is_refused_without(tmp_path: Path) -> None:
    p, sink = _opaque(tmp_path, "list", allow_pickle=True)
    result = p.run(launcher=LAUNCHER)
    assert sorted(sink.results()) == sorted((x % 5, x) for x in range(1, 1001))
    assert result.latest_checkpoint is not None
    # Loading that checkpoint would unpickle: refused without the opt-in.
    again, _ = _opaque(tmp_path, "list", allow_pickle=False)
    with pytest.raises(JobFailedError) as e:
        again.run(launcher=LAUNCHER, from_checkpoint=result.latest_checkpoint)
    assert "the state holds pickled objects" in str(e.value)
    assert "allow_pickle=True" in str(e.value)
    assert sorted(sink.results()) == sorted((x % 5, x) for x in range(1, 1001))


# ------------------------------------- every kind of user code names its operator


class Hooks(KeyedProcessFunction[int, int]):
    """Raises in the hook named ``fail_in`` (if any), passes records through."""

    def __init__(self, fail_in: str) -> None:
        self.fail_in = fail_in

    def _maybe_fail(self, hook: str) -> None:
        if hook == self.fail_in:
            raise RuntimeError(f"{hook} broke")

    def open(self, ctx: RuntimeContext) -> None:
        self._maybe_fail("open")

    def process_element(self, value: int, ctx: RuntimeContext) -> Iterable[int]:
        self._maybe_fail("process_element")
        return [value]

    def end_input(self, ctx: RuntimeContext) -> Iterable[int] | None:
        self._maybe_fail("end_input")
        return None

    def finish(self, ctx: RuntimeContext) -> Iterable[int] | None:
        self._maybe_fail("finish")
        return None


def key_of(x: int) -> int:
    return x % 7


def broken_key(x: int) -> int:
    raise RuntimeError("key selector broke")


@pytest.mark.parametrize("where", ["open", "process_element", "end_input", "finish",
                                   "key selector"])
def test_user_code_error_names_the_operator(tmp_path: Path, where: str) -> None:
    sink = CollectSink(str(tmp_path / "collect"))
    p = Pipeline("hooks", parallelism=2, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 500), uid="numbers")
       .key_by(broken_key if where == "key selector" else key_of)
       .process(Hooks(where), uid="hooks")
       .sink(sink, uid="out"))
    with pytest.raises(JobFailedError) as e:
        p.run(launcher=LAUNCHER)
    msg = str(e.value)
    owner = "the key selector of operator" if where == "key selector" else "operator"
    assert f"UserFunctionError: {owner} 'hooks' raised RuntimeError" in msg, msg
    assert f"{where} broke" in msg, msg
    assert sink.results() == []


def fails_on_300(x: int) -> int:
    if x == 300:
        raise ValueError(f"bad reading {x}")
    return x


def test_a_deterministic_user_error_backs_off_and_prints_its_traceback_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same error again after a restart: its traceback is not printed
    again, the restarts back off instead of spinning, and the messages name
    the operator, where in the task's input it was, and how many times."""
    p = Pipeline("deterministic", parallelism=1,
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0),
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 1000), uid="numbers")
       .map(fails_on_300, uid="parse")
       .sink(CollectSink(str(tmp_path / "collect")), uid="out"))
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="lockgate"), pytest.raises(JobFailedError) as e:
        p.run(launcher=LAUNCHER)
    took = time.monotonic() - started
    text = caplog.text
    tracebacks = [r for r in caplog.records if "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1, text
    assert "operator 'parse' raised ValueError: bad reading 300" in str(e.value)
    assert "failed after 4 failure(s) (3 restarts)" in str(e.value)
    assert text.count("failed the same way again") == 2, text  # the last one ends the job
    assert "input records 1..300" in text or "its first record: 1" in text, text
    assert took >= 0.5 + 1.0, "no back-off between identical failures"


def test_a_function_that_cannot_travel_to_the_tasks_is_named_before_the_job_starts(
        tmp_path: Path) -> None:
    import threading

    lock = threading.Lock()  # captured by the map's closure: cannot be pickled
    p = Pipeline("unpicklable", parallelism=1, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 100), uid="numbers")
       .map(lambda x: (x, lock.locked()), uid="bad")
       .sink(CollectSink(str(tmp_path / "collect")), uid="out"))
    with pytest.raises(PipelineDefinitionError) as e:
        p.run(launcher=LAUNCHER)
    message = str(e.value)
    assert "the function of operator 'bad' cannot be sent to the tasks" in message
    assert "_thread.lock" in message and "open()" in message
    assert not (tmp_path / "chk").exists() or not any((tmp_path / "chk").iterdir())
