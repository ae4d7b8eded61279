"""Processing-time timers: a keyed function holds each key's records back
until a timer a few milliseconds after the first one fires, then emits them.

No record reaches the output except through a timer, so a timer lost in a
restore loses records and a timer that fires twice doubles them: each test
compares the committed records, one by one, with the input. The input is a
watched folder, an unbounded source: the job runs until every timer fired
and was committed, then it is cancelled (at the end of input pending
processing-time timers do not fire, as in Flink: see the last test)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from lockgate import (
    END_OF_TIME,
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    ListStateDescriptor,
    Pipeline,
    TimeDomain,
)
from lockgate.api.result import Progress
from lockgate.cli.savepoint import describe_savepoint
from lockgate.connectors import FileSink, FileSource
from lockgate.spark import _load_metadata, _read_entries
from tests.fixtures import committed_lines, hidden_files, start_and_await

KEYS = 7


class HoldBack(KeyedProcessFunction):
    """Per key: the first record registers a processing-time timer
    ``delay_ms`` (plus ``stagger_ms`` times the key) later; the timer emits
    every record that came since, as
    ``[key, time domain, timer timestamp, fired at, attempt, records]``.
    With ``flush_at_end``, an event-time timer at END_OF_TIME emits what is
    left at the end of input."""

    def __init__(self, delay_ms: int, stagger_ms: int = 0, flush_at_end: bool = False) -> None:
        self.delay_ms = delay_ms
        self.stagger_ms = stagger_ms
        self.flush_at_end = flush_at_end

    def open(self, ctx):
        self.pending = ctx.get_list_state(ListStateDescriptor("pending"))

    def process_element(self, e, ctx):
        if not self.pending.get():
            timers = ctx.timer_service
            delay = self.delay_ms + self.stagger_ms * ctx.current_key
            timers.register_processing_time_timer(timers.current_processing_time() + delay)
            if self.flush_at_end:
                timers.register_event_time_timer(END_OF_TIME)
        self.pending.add(e["i"])

    def on_timer(self, ts, ctx):
        records = self.pending.get()
        self.pending.clear()
        if not records:
            return None
        now = ctx.timer_service.current_processing_time()
        return [[ctx.current_key, ctx.time_domain, ts, now, ctx.attempt, records]]


def write_file(folder: Path, name: str, records: range) -> None:
    """A new input file, made visible at once (written hidden, then renamed)."""
    hidden = folder / f".{name}"
    hidden.write_text("".join(f'{{"i": {i}}}\n' for i in records))
    hidden.rename(folder / name)


def write_input(folder: Path, n: int, files: int = 4) -> None:
    folder.mkdir()
    per = n // files
    for f in range(files):
        write_file(folder, f"part-{f}.jsonl", range(f * per, (f + 1) * per))


def pipeline(tmp: Path, parallelism: int, delay_ms: int, stagger_ms: int = 0) -> Pipeline:
    p = Pipeline("hold-back", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")),
                 restart=FixedDelayRestart(max_attempts=10, delay_s=0.0))
    (p.source(FileSource(str(tmp / "in"), format="jsonl", watch=True, poll_interval=0.2),
              uid="events")
       .key_by(lambda e: e["i"] % KEYS)
       .process(HoldBack(delay_ms, stagger_ms), uid="hold")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def emitted(out: Path) -> list[int]:
    """Every committed record, in the order of the committed lines, after
    checking each line: the right key, and a processing-time timer never early."""
    records = []
    for key, domain, ts, fired_at, _, batch in committed_lines(out):
        assert domain == TimeDomain.PROCESSING_TIME, domain
        assert fired_at >= ts, f"a timer of {ts} fired early, at {fired_at}"
        assert batch and all(i % KEYS == key for i in batch)
        records += batch
    return records


def saved(savepoint: str, state: str) -> dict[int, object]:
    """Key -> value of one keyed state of ``hold`` in a savepoint (read
    without Spark, with the reader ``read_state`` runs on executors)."""
    location, meta = _load_metadata(savepoint)
    handles = [h for h in meta.operators["hold"].subtasks if h]
    return dict(_read_entries(location, state, handles))


def run_until_all_committed(p: Pipeline, out: Path, n: int,
                            feed: Callable[[Progress], None] | None = None, **start) -> None:
    """Start the job, await the checkpoint after which all ``n`` records are
    committed, then cancel it (the watched folder never ends). ``feed`` sees
    every progress report first (it may add input)."""
    done = threading.Event()

    def on_progress(progress: Progress) -> None:
        if feed is not None:
            feed(progress)
        if len(emitted(out)) >= n:
            done.set()

    client = p.start(launcher="local", on_progress=on_progress, **start)
    try:
        assert done.wait(180), f"{len(emitted(out))} of {n} records committed"
    finally:
        client.cancel()


def test_processing_time_timers_are_exact_under_kills(tmp_path: Path) -> None:
    """SIGKILLs while input arrives, timers are pending, fire and are being
    committed: the timers of the restored checkpoint fire again (overdue ones
    at once), those whose output was committed do not, and each record is
    committed once. A file arrives with every completed checkpoint; the last
    ones only once every kill happened, so the last attempt has input too.
    The keys' timers are 200 to 800 ms apart, so that at almost every
    checkpoint some key holds records back: a restore brings timers back."""
    files, per = 40, 500
    folder = tmp_path / "in"
    folder.mkdir()
    faults = [
        {"point": "batch", "task": 0, "attempt": 0, "count": 5},     # a source, mid-input
        {"point": "commit", "task": 3, "attempt": 1, "count": 3},    # a sink at a commit
        {"point": "snapshot", "task": 2, "attempt": 2, "count": 3},  # the keyed task's snapshot
        {"point": "acked", "task": 1, "attempt": 3, "count": 2},     # a source after its ack
    ]
    written = 0

    def feed(progress: Progress) -> None:
        nonlocal written
        if written < files - 5 or (written < files and progress.restarts == len(faults)):
            records = range(written * per, (written + 1) * per)
            write_file(folder, f"part-{written:03}.jsonl", records)
            written += 1

    run_until_all_committed(pipeline(tmp_path, 2, delay_ms=200, stagger_ms=100),
                            tmp_path / "out", files * per,
                            feed, fault_injection=faults)
    assert sorted(emitted(tmp_path / "out")) == list(range(files * per)), "lost or doubled"
    attempts = {line[4] for line in committed_lines(tmp_path / "out")}
    assert len(faults) in attempts, attempts  # restored, the last attempt fired timers too
    assert hidden_files(tmp_path / "out") == []


def test_stop_keeps_processing_time_timers_and_resumed_they_fire(tmp_path: Path) -> None:
    """A stop without drain while keys hold records back: their timers (5 s
    away) are in the savepoint, beside the records. Resumed at another
    parallelism (timers move with their key groups), each restored timer
    fires once at its own timestamp and emits the records saved with it; new
    records get timers of their own; every record is committed once."""
    n = 20_000
    write_input(tmp_path / "in", n)
    first = start_and_await(pipeline(tmp_path, 2, delay_ms=5_000), launcher="local",
                            until=lambda pr: pr.records_read == n,
                            what="the input was not read")
    stopped = first.stop(str(tmp_path / "sp"))
    assert stopped.status == "stopped"
    hold = next(op for op in describe_savepoint(stopped.savepoint)["operators"]
                if op["uid"] == "hold")
    assert hold["keyed_states"] == {"pending": "list", "_processing_timers": "map"}
    timers, pending = saved(stopped.savepoint, "_processing_timers"), saved(stopped.savepoint,
                                                                           "pending")
    assert pending, "no key held records back at the stop"
    assert timers.keys() == pending.keys()  # a key holds records back <=> it has a timer
    assert all(len(stamps) == 1 for stamps in timers.values())

    write_file(tmp_path / "in", "part-more.jsonl", range(n, n + 1_000))
    run_until_all_committed(pipeline(tmp_path, 3, delay_ms=20), tmp_path / "out", n + 1_000,
                            from_savepoint=stopped.savepoint)
    assert sorted(emitted(tmp_path / "out")) == list(range(n + 1_000))
    lines = committed_lines(tmp_path / "out")
    for key, stamps in timers.items():
        (ts,) = stamps
        fired = [line for line in lines if line[0] == key and line[2] == ts]
        assert len(fired) == 1, f"key {key}'s restored timer fired {len(fired)} times"
        # the records saved with it, then maybe new ones that came before it fired
        assert fired[0][5][:len(pending[key])] == pending[key]
    assert hidden_files(tmp_path / "out") == []


def test_a_bounded_job_does_not_wait_for_processing_time_timers(tmp_path: Path) -> None:
    """At the end of input pending processing-time timers (an hour away) do
    not fire and the job does not wait for them; an event-time timer at
    END_OF_TIME, which fires at the end of input, emits every record once."""
    n = 10_000
    write_input(tmp_path / "in", n)
    p = Pipeline("bounded", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    (p.source(FileSource(str(tmp_path / "in"), format="jsonl"), uid="events")
       .key_by(lambda e: e["i"] % KEYS)
       .process(HoldBack(3_600_000, flush_at_end=True), uid="hold")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    result = p.start(launcher="local").result(timeout=120)
    assert result.status == "finished"
    lines = committed_lines(tmp_path / "out")
    assert sorted(line[0] for line in lines) == list(range(KEYS))  # one line per key
    assert {(line[1], line[2]) for line in lines} == {(TimeDomain.EVENT_TIME, END_OF_TIME)}
    assert sorted(i for line in lines for i in line[5]) == list(range(n))
