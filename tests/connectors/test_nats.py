"""NATS connectors against the real server (``LOCKGATE_TEST_NATS``, default
``nats://127.0.0.1:4222``): JetStream source positions and rescaling through
savepoints, the write-ahead sink base (nothing published before its
checkpoint completes; records sent again after a failure are dropped by
JetStream's de-duplication, or repeated by core NATS), and JetStream ->
running sums -> JetStreamSink under SIGKILLs on both launchers, the output
compared record by record. Every test uses streams and subjects of its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, JetStreamSink, JetStreamSource, NatsSink, TaskInfo
from lockgate.connectors.nats.splits import deal_subject_splits, subjects_overlap
from lockgate.errors import ConfigurationError, LockgateError
from tests.connectors import nats_server
from tests.connectors.nats_server import make_stream, publish, stream_payloads, unique
from tests.fault.checks import drive
from tests.fixtures import check_exact_sums, check_running_sums, operator_state, start_and_await

HERE = Path(__file__).parent


def info(task: int = 0, parallelism: int = 1, job: str = "job", attempt: int = 0) -> TaskInfo:
    return TaskInfo(job, "out", task, parallelism, 128, attempt)


def numbers(name: str, lo: int, hi: int, subjects: int = 2) -> list[tuple[str, bytes]]:
    """``lo..hi`` as messages, ``x`` on subject ``<name>.<x % subjects>``."""
    return [(f"{name}.{x % subjects}", str(x).encode()) for x in range(lo, hi + 1)]


def read_all(source: JetStreamSource, task: int, p: int,
             state: list | None = None) -> tuple[list, list]:
    reader = source.create_reader(info(task, p))
    reader.restore(state)
    got: list = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            batch = reader.poll(300)
            if batch is None:
                return got, reader.snapshot_state(1)
            got += batch
            if not batch:  # as a task does: no busy loop that starves the fetcher thread
                time.sleep(0.001)
        raise AssertionError("the bounded reader did not end within 120 s")
    finally:
        reader.close()


# ------------------------------------------------------------------ pure


def test_subject_filters_overlap():
    assert subjects_overlap("a.b", "a.b") and subjects_overlap("a.*", "a.b")
    assert subjects_overlap("a.>", "a.b.c") and subjects_overlap(">", "x")
    assert not subjects_overlap("a.b", "a.c") and not subjects_overlap("a.*", "a.b.c")
    assert not subjects_overlap("a.>", "a") and not subjects_overlap("a.b", "a.b.c")
    with pytest.raises(LockgateError, match="overlap"):
        JetStreamSource("s", subjects=["s.a", "s.*"])


def test_splits_are_dealt_on_rescale():
    entries = [{"stream": "s", "subject": f"s.{i}", "next": 10 + i, "end": None,
                "owner": i % 2, "of": 2} for i in range(3)]
    # same parallelism: every task its own; a subject added since goes round-robin
    fresh = [{"stream": "s", "subject": "s.9", "next": 1, "end": None}]
    assert [s["subject"] for s in deal_subject_splits(entries, fresh, "s", 0, 2)] == [
        "s.0", "s.2", "s.9"]
    # another parallelism: dealt again by subject, every split once
    for p in (1, 3, 4):
        dealt = [s for i in range(p) for s in deal_subject_splits(entries, [], "s", i, p)]
        assert sorted((s["subject"], s["next"]) for s in dealt) == [
            ("s.0", 10), ("s.1", 11), ("s.2", 12)]
    with pytest.raises(LockgateError, match="not a position"):
        deal_subject_splits([{"stream": "other", "subject": None, "next": 1}], [], "s", 0, 1)


# ------------------------------------------------------------ the source


def test_source_positions_and_resume(nats_url):
    name = unique("src")
    make_stream(nats_url, name, [f"{name}.>"])
    publish(nats_url, numbers(name, 1, 3000))
    source = JetStreamSource(name, subjects=[f"{name}.0", f"{name}.1"], url=nats_url,
                             bounded=True, deserializer=int)
    source.validate()
    source.prepare("unused", "numbers")
    assert source.end_sequence == 3000
    # a reader stopped part-way: its state is the next stream sequence per subject
    reader = source.create_reader(info(0, 1))
    reader.restore(None)
    first: list[int] = []
    while len(first) < 1000:
        first += reader.poll(100) or []
    state = reader.snapshot_state(1)
    reader.close()
    assert {s["subject"]: s["next"] for s in state}.keys() == {f"{name}.0", f"{name}.1"}
    for s in state:  # x is at sequence x: the next sequence follows the last read
        parity = int(s["subject"].rsplit(".", 1)[1])
        assert s["next"] == max(x for x in first if x % 2 == parity) + 1
    # restored at parallelism 2, the rest is read once, across the two tasks
    rest = [x for t in range(2) for x in read_all(source, t, 2, state)[0]]
    assert sorted(first + rest) == list(range(1, 3001))
    # the whole stream as one split, with metadata
    whole = JetStreamSource(name, url=nats_url, bounded=True, metadata=True)
    whole.prepare("unused", "numbers")
    msgs, end_state = read_all(whole, 0, 1)
    assert [m.sequence for m in msgs] == list(range(1, 3001))
    assert msgs[0].subject == f"{name}.1" and msgs[0].value == b"1"
    assert end_state[0]["next"] == 3001


def test_the_readers_backlog_is_what_jetstream_has_pending(nats_url):
    """What the autoscaler reads of a JetStream source: the messages of its
    splits not read yet (JetStream's ``num_pending`` after the last fetch,
    and the fetched ones not returned), falling as the reader reads."""
    name = unique("lag")
    make_stream(nats_url, name, [f"{name}.>"])
    publish(nats_url, numbers(name, 1, 2000))
    source = JetStreamSource(name, subjects=[f"{name}.0", f"{name}.1"], url=nats_url,
                             deserializer=int)
    source.validate()
    reader = source.create_reader(info(0, 1))
    reader.restore(None)
    try:
        read: list[int] = []
        deadline = time.monotonic() + 60
        while len(read) < 500:
            assert time.monotonic() < deadline, "no messages within 60 s"
            read += reader.poll(100) or []
            time.sleep(0.001)
        # (a fetch moves a message from pending to the buffer: wait out that moment)
        while reader.backlog() != 2000 - len(read):
            assert time.monotonic() < deadline, (reader.backlog(), len(read))
            time.sleep(0.01)
        while len(read) < 2000:
            assert time.monotonic() < deadline, "not every message within 60 s"
            read += reader.poll(500) or []
            time.sleep(0.001)
        assert reader.backlog() == 0
        publish(nats_url, numbers(name, 2001, 2100))
        while reader.backlog() != 100:  # fetched in the background, not read yet
            assert time.monotonic() < deadline, "the new messages not seen within 60 s"
            time.sleep(0.01)
    finally:
        reader.close()


def test_a_bounded_splits_pending_count_stops_at_its_end(nats_url):
    """JetStream counts a split's messages published past a bounded read's
    end as pending too; the split counts them no further than its end, also
    when a fetch found nothing and the count comes from the consumer."""
    from lockgate.connectors.nats.client import NatsConnection
    from lockgate.connectors.nats.source import _SplitFetcher

    name = unique("end")
    make_stream(nats_url, name, [f"{name}.>"])
    publish(nats_url, [(f"{name}.a", str(x).encode()) for x in range(1, 11)]
            + [(f"{name}.b", b"11"), (f"{name}.b", b"12")])
    source = JetStreamSource(name, subjects=[f"{name}.a"], url=nats_url, bounded=True,
                             deserializer=int)
    source.prepare("unused", "numbers")
    assert source.end_sequence == 12
    conn = NatsConnection(nats_url)
    try:
        fetcher = _SplitFetcher(source, conn, {"stream": name, "subject": f"{name}.a",
                                               "next": 1, "end": 12})
        fetcher.future.result(60)  # sequences 1..10, the last with nothing pending: the end
        assert fetcher.last == 10 and fetcher.pending == 0
        publish(nats_url, [(f"{name}.a", str(x).encode()) for x in range(13, 53)])
        consumer = conn.call(lambda: conn.nc.jsm().consumer_info(name, fetcher.consumer), 30)
        assert consumer.num_pending == 40  # past the end, all of them
        assert not fetcher._found_nothing(int(consumer.num_pending))
        assert fetcher.pending == 2  # sequences 11 and 12 at most: the split's end
    finally:
        conn.close()


def test_source_refuses_a_missing_stream(nats_url):
    with pytest.raises(ConfigurationError, match="no stream"):
        JetStreamSource(unique("absent"), url=nats_url).validate()


def test_rescale_through_savepoints(tmp_path, nats_url):
    """Unbounded at 2 tasks, stopped with a savepoint; more input; resumed
    bounded at 1 task, then at 3 from that job's end: every record once."""
    name = unique("resc")
    make_stream(nats_url, name, [f"{name}.>"])
    subjects = [f"{name}.{i}" for i in range(3)]
    publish(nats_url, numbers(name, 1, 2000, 3))

    def job(p: int, bounded: bool) -> Pipeline:
        pipe = Pipeline("nats-rescale", parallelism=p,
                        checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
        (pipe.source(JetStreamSource(name, subjects=subjects, url=nats_url, bounded=bounded,
                                     deserializer=int), uid="numbers")
             .map(lambda x: (x % 3, x), uid="pairs").key_by(lambda kv: kv[0])
             .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
             .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
        return pipe

    client = start_and_await(job(2, False), launcher="local",
                             until=lambda pr: pr.records_read >= 2000, rest=False)
    first = client.stop(str(tmp_path / "sp")).savepoint
    assert first is not None
    positions = {s["subject"]: s["next"] for entries in operator_state(first, "numbers")
                 for s in entries}
    # x is at stream sequence x, on subject x % 3: each split's next sequence
    # follows the last of its 2000 records
    assert positions == {f"{name}.{k}": max(x for x in range(1, 2001) if x % 3 == k) + 1
                         for k in range(3)}
    publish(nats_url, numbers(name, 2001, 3000, 3))
    result = job(1, True).run(launcher="local", from_savepoint=first, rest=False)
    assert result.status == "finished"
    publish(nats_url, numbers(name, 3001, 3600, 3))
    final = result.latest_checkpoint
    assert final is not None
    result = job(3, True).run(launcher="local", from_checkpoint=final, rest=False)
    assert result.status == "finished"
    check_exact_sums(tmp_path / "out", 3600, 3)


# ------------------------------------------------------ write-ahead sinks


def test_nothing_is_published_before_its_checkpoint_completes(nats_url):
    name = unique("wa")
    make_stream(nats_url, name, [f"{name}.>"])
    sink = JetStreamSink(f"{name}.out", url=nats_url)
    sink.validate()
    writer = sink.create_writer(info())
    try:
        writer.restore([])
        writer.write_batch([{"n": i} for i in range(100)])
        state = writer.snapshot_state(1)
        writer.write_batch([{"n": i} for i in range(100, 150)])
        assert stream_payloads(nats_url, name) == []  # pre-committed only
        assert writer.pending_checkpoints == [1]
        writer.notify_checkpoint_aborted(1)
        state = writer.snapshot_state(2)  # checkpoint 1's records stay with 2's
        assert [e["checkpoint_id"] for e in state] == [1, 2]
        assert stream_payloads(nats_url, name) == []
        writer.notify_checkpoint_complete(2)
        got = [json.loads(p)["n"] for p in stream_payloads(nats_url, name)]
        assert got == list(range(150)) and writer.pending_checkpoints == []
    finally:
        writer.close()
    # recovery from checkpoint 2 (its records were sent: the ids say so)
    again = sink.create_writer(info(attempt=1))
    try:
        again.restore(state)
        assert again.duplicates == 150
    finally:
        again.close()
    assert len(stream_payloads(nats_url, name)) == 150


def test_recovery_sends_every_task_s_entries_once_at_any_parallelism(nats_url):
    name = unique("wa_resc")
    make_stream(nats_url, name, [f"{name}.>"])
    sink = JetStreamSink(lambda r: f"{name}.k{r % 3}", url=nats_url)
    state: list = []
    for t in range(3):  # three tasks pre-commit checkpoint 5, then all die
        w = sink.create_writer(info(t, 3))
        w.restore([])
        w.write_batch(list(range(t * 100, t * 100 + 100)))
        state += w.snapshot_state(5)
        w.close()
    sent = 0
    for t in range(2):  # restored at 2 tasks: union state, each sends its share
        w = sink.create_writer(info(t, 2, attempt=1))
        w.restore(state)
        sent += w.sent
        w.close()
    assert sent == 300
    assert sorted(int(p) for p in stream_payloads(nats_url, name)) == list(range(300))
    with pytest.raises(LockgateError, match="not a write-ahead entry"):
        sink.create_writer(info()).restore([{"checkpoint_id": 1}])


def test_core_nats_sink_is_at_least_once(nats_url):
    """Without de-duplication a recovery sends the checkpoint again."""
    import nats

    subject = unique("core")
    sink = NatsSink(subject, url=nats_url)
    assert not sink.exactly_once

    async def run() -> list[bytes]:
        nc = await nats.connect(nats_url)
        sub = await nc.subscribe(subject)
        await nc.flush()
        await asyncio.to_thread(send_twice)
        got = []
        try:
            while True:
                got.append((await sub.next_msg(timeout=1)).data)
        except Exception:
            pass
        await nc.close()
        return got

    def send_twice() -> None:
        w = sink.create_writer(info())
        w.restore([])
        w.write_batch(["a", "b"])
        state = w.snapshot_state(1)
        w.notify_checkpoint_complete(1)
        w.close()
        again = sink.create_writer(info(attempt=1))
        again.restore(state)
        again.close()

    assert asyncio.run(run()) == [b"a", b"b", b"a", b"b"]


def test_a_short_duplicate_window_is_refused(nats_url):
    name = unique("dw")
    make_stream(nats_url, name, [f"{name}.>"], duplicate_window=5)
    with pytest.raises(ConfigurationError, match="duplicate_window"):
        JetStreamSink(f"{name}.out", url=nats_url).validate()
    JetStreamSink(f"{name}.out", url=nats_url, min_duplicate_window=5).validate()
    with pytest.raises(ConfigurationError, match="no stream"):
        JetStreamSink(f"{unique('nowhere')}.x", url=nats_url).validate()


# ------------------------------------------------------------ under kills


def run_sums(tmp_path: Path, url: str, launcher: str, *, n: int, kills: int = 0,
             faults: list | None = None, seed: int = 0) -> tuple[dict, int, str]:
    name = unique(f"sums_{launcher}")
    make_stream(url, name, [f"{name}.in.>", f"{name}.out"])
    publish(url, [(f"{name}.in.{x % 2}", str(x).encode()) for x in range(1, n + 1)])
    cmd = [sys.executable, str(HERE / "nats_sums_job.py"), "--url", url, "--stream", name,
           "--subjects", f"{name}.in.0,{name}.in.1", "--out", f"{name}.out",
           "--storage", str(tmp_path / "chk"), "--parallelism", "2", "--keys", "5",
           "--interval", "0.2", "--pause", "0.0003", "--faults", json.dumps(faults or []),
           "--launcher", launcher]
    result, done = drive(cmd, kills=kills, tasks=4, seed=seed, kill_delays=(0.3, 1.0),
                         timeout=240)
    return result, done, name


def check_output(url: str, name: str, n: int, result: dict) -> None:
    """The output subject holds exactly the running sums: nothing lost, nothing twice."""
    assert result["status"] == "finished" and result["guarantee"] == "exactly_once"
    out = [json.loads(p) for p in stream_payloads(url, name) if p.startswith(b"[")]
    check_running_sums(out, n, 5)


def test_kills_at_protocol_points_and_random_moments(tmp_path, nats_url, launcher):
    """Kills of the sink tasks between pre-commit and commit (``acked``) and
    after the completion notice arrived (``commit``), then 3 at random
    moments (a kill while a checkpoint's records are being published makes
    the recovery publish some twice: JetStream drops them by id)."""
    n = 12000
    faults = [{"point": "acked", "task": 2, "attempt": 0, "count": 3},
              {"point": "commit", "task": 3, "attempt": 1, "count": 2}]
    result, kills, name = run_sums(tmp_path, nats_url, launcher, n=n, faults=faults, kills=3,
                                   seed=7)
    assert kills == 3, f"only {kills} random kills happened"
    assert result["restarts"] >= len(faults), result["failures"]
    check_output(nats_url, name, n, result)


def test_example_nats_sums(tmp_path, nats_url):
    """``examples/nats_sums.py`` as ``lockgate run`` runs it (streams of its own)."""
    import os
    import subprocess

    prefix = unique("EX").upper()
    env = dict(os.environ, NATS_URL=nats_url, NATS_PREFIX=prefix)
    example = HERE.parents[1] / "examples" / "nats_sums.py"
    cmd = [sys.executable, "-m", "lockgate.cli", "run", str(example), "--launcher", "local",
           "-q", "3000"]
    try:
        out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "guarantee exactly_once" in out.stderr + out.stdout
        sums = [json.loads(p) for p in stream_payloads(nats_url, f"{prefix}_SUMS")]
        check_running_sums(sums, 3000, 10)
    finally:
        for stream in (f"{prefix}_NUMBERS", f"{prefix}_SUMS"):
            try:
                nats_server.delete_stream(nats_url, stream)
            except Exception:
                pass
