"""KafkaSource and KafkaSink against a real Kafka-protocol broker (a noida-db
broker this session starts, or ``LOCKGATE_TEST_KAFKA=host:port``; see
``tests/connectors/kafka_server.py``). Every test has topics of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, KeyedProcessFunction, Pipeline, WatermarkStrategy
from lockgate.connectors import CollectSink, FileSink, SequenceSource
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.kafka import KafkaSink, KafkaSource
from lockgate.connectors.kafka.sink import KafkaTransactionalWriter, _produce, _serialized
from lockgate.connectors.kafka.sink_plan import transactional_id
from lockgate.connectors.kafka.source import owner_of
from lockgate.errors import ConfigurationError
from tests.connectors.kafka_server import kafka_broker_fixture  # noqa: F401 - kafka_broker
from tests.connectors.kafka_sums_job import build
from tests.connectors.kafka_topics import new_topic, produce_numbers, read_all, sums_of
from tests.fault.checks import RandomKiller, task_processes
from tests.fixtures import check_running_sums, committed_lines, operator_state, start_and_await

pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException, Producer

HERE = Path(__file__).parent
KEYS = 5
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))


def positions(savepoint: str, uid: str = "numbers") -> dict[tuple[str, int], int]:
    """The next offset of every partition in a source's checkpointed state."""
    found: dict[tuple[str, int], int] = {}
    for entries in operator_state(savepoint, uid):
        for e in entries:
            split = (e["topic"], e["partition"])
            assert split not in found, f"partition {split} twice in the state"
            found[split] = e["next"]
    return found


# ------------------------------------------------------------------ source


def test_bounded_source_reads_committed_records_to_the_end_offsets(tmp_path, kafka_broker):
    """A bounded read ends at the end offsets of the job's start, reads every
    committed record once (an aborted transaction's records never), and keeps
    one position per partition in its state, at the end offset."""
    topic = new_topic(kafka_broker, "bounded", 3)
    produce_numbers(kafka_broker, topic, 1, 3_000, 3)
    aborted = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"t-{topic}"})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    for p in range(3):
        aborted.produce(topic, b"-1", partition=p)
    aborted.flush(30)
    aborted.abort_transaction(30)
    produce_numbers(kafka_broker, topic, 3_001, 3_600, 3)

    sink = CollectSink(str(tmp_path / "out"))
    p = Pipeline("kafka-bounded", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(KafkaSource(kafka_broker, topic, bounded=True), uid="numbers")
       .map(lambda r: (r.partition, r.offset, int(r.value)), uid="fields")
       .sink(sink, uid="out"))
    result = p.run(launcher="local")
    assert result.status == "finished", result
    got = sink.results()
    assert sorted(x for _, _, x in got) == list(range(1, 3_601))
    assert len({(part, off) for part, off, _ in got}) == len(got)
    final = max((tmp_path / "chk").glob("*/chk-*"), key=lambda d: int(d.name[4:]))
    ends = positions(str(final))
    assert sorted(ends) == [(topic, 0), (topic, 1), (topic, 2)]
    # 1200 records per partition, an abort marker and the aborted record: 1202
    assert all(nxt == 1_202 for nxt in ends.values()), ends


def test_partitions_are_dealt_stably():
    """Every partition has one owner at every parallelism, and adding
    partitions moves none of the others."""
    for p in (1, 2, 3, 5):
        owners = {s: owner_of(s, p) for s in [("a", i) for i in range(8)]}
        assert all(0 <= o < p for o in owners.values())
        more = {s: owner_of(s, p) for s in [("a", i) for i in range(12)]}
        assert all(more[s] == o for s, o in owners.items())


class LateOrTimer(KeyedProcessFunction):
    """Emits ``["late", ts]`` for a record at or behind the watermark, and
    ``["fired", ts]`` when the event-time timer at ``fire_at`` fires."""

    def __init__(self, fire_at: int | None = None) -> None:
        self.fire_at = fire_at

    def process_element(self, r, ctx):
        if self.fire_at is not None:
            ctx.timer_service.register_event_time_timer(self.fire_at)
        if r.timestamp <= ctx.timer_service.current_watermark():
            return [["late", r.timestamp]]
        return None

    def on_timer(self, ts, ctx):
        return [["fired", ts]]


def _produce_timed(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, str(i).encode(), partition=partition, timestamp=BASE + i)
    assert producer.flush(30) == 0


BASE = int(time.time() * 1000) - 3_600_000
"""An hour ago: records far older than the topic's retention would be deleted."""


def test_one_watermark_per_partition_makes_no_record_late(tmp_path, kafka_broker):
    """One task reads three partitions that walk through the same event
    time; it reads them in turns, chunk by chunk, but its watermark is the
    smallest of its partitions': no record is behind it."""
    topic = new_topic(kafka_broker, "event-time", 3)
    for part in range(3):
        _produce_timed(kafka_broker, topic, part, 3_000)
    sink = CollectSink(str(tmp_path / "out"))
    p = Pipeline("kafka-event-time", parallelism=1,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(KafkaSource(kafka_broker, topic, bounded=True), uid="numbers",
              watermarks=WatermarkStrategy(lambda r: r.timestamp, 0, interval=0))
       .key_by(lambda r: 0)
       .process(LateOrTimer(), uid="late")
       .sink(sink, uid="out"))
    result = p.run(launcher="local")
    assert result.status == "finished" and result.records_in == 9_000, result
    assert sink.results() == []


def test_an_idle_partition_stops_holding_the_watermark_back(tmp_path, kafka_broker):
    """Unbounded, one partition with records and one empty: with
    ``partition_idle_timeout`` event time moves on (a timer fires)."""
    topic = new_topic(kafka_broker, "idle", 2)
    _produce_timed(kafka_broker, topic, 0, 1_000)
    p = Pipeline("kafka-idle", parallelism=1,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(KafkaSource(kafka_broker, topic, partition_idle_timeout=0.5), uid="numbers",
              watermarks=WatermarkStrategy(lambda r: r.timestamp, 0, interval=0.1))
       .key_by(lambda r: 0)
       .process(LateOrTimer(fire_at=BASE + 500), uid="late")
       .sink(sink, uid="out"))
    client = start_and_await(p, launcher="local", until=lambda pr: pr.records_written >= 1,
                             timeout=60, what="the idle partition held the watermark back")
    client.cancel()
    assert sink.results() == [["fired", BASE + 500]]


def _throttle(r):
    time.sleep(0.0005)  # ~2,000 records/s a task: every hop stops part of the way
    return r


def _rescale_job(tmp: Path, bootstrap: str, topic: str, parallelism: int) -> Pipeline:
    p = Pipeline("kafka-rescale", parallelism=parallelism, batch_size=64,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")))
    (p.source(KafkaSource(bootstrap, topic, discovery_interval=0.5), uid="numbers")
       .map(_throttle, uid="slow")
       .map(lambda r: (int(r.value) % KEYS, int(r.value)), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def test_source_rescaled_2_3_1_through_savepoints_reads_every_record_once(
        tmp_path, kafka_broker):
    """Unbounded, stopped with a savepoint part of the way at 2, 3 and 1
    tasks while records keep coming; every task of each hop reads its
    partitions on from the savepoint's offsets; the running sums are exact.
    Each hop starts with 2,000 records more than the last one can have read,
    so the 1,500 it waits for are always there."""
    topic = new_topic(kafka_broker, "rescale", 4)
    produce_numbers(kafka_broker, topic, 1, 4_000, 4)
    n, savepoint = 4_000, None
    for hop, p in enumerate((2, 3, 1)):
        if hop:  # a stop reads on until its barrier: a hop may have read all there was
            produce_numbers(kafka_broker, topic, n + 1, n + 2_000, 4)
            n += 2_000
        read = sum(positions(savepoint).values()) if savepoint else 0
        client = start_and_await(_rescale_job(tmp_path, kafka_broker, topic, p),
                                 launcher="local", from_savepoint=savepoint,
                                 until=lambda pr, read=read: pr.records_read >= read + 1_500,
                                 timeout=240, what="the hop read too little")
        produce_numbers(kafka_broker, topic, n + 1, n + 1_000, 4)
        n += 1_000
        last = hop == 2
        if last:  # the last hop reads to the end, then drains
            deadline = time.monotonic() + 240
            while len(committed_lines(tmp_path / "out")) < n and time.monotonic() < deadline:
                time.sleep(0.2)  # the committed files are polled: no event to await
        before = positions(savepoint) if savepoint else {}
        result = client.stop(str(tmp_path / "savepoints"), drain=last)
        assert result.status == ("finished" if last else "stopped"), result
        savepoint = result.savepoint
        after = positions(savepoint)
        assert len(after) == 4, after
        moved = {owner_of(s, p) for s in after if after[s] > before.get(s, 0)}
        assert moved == set(range(p)), f"hop {hop}: only tasks {moved} of {p} read on"
    check_running_sums(committed_lines(tmp_path / "out"), n, KEYS)


# -------------------------------------------------------------------- sink


def _info(job: str, task: int = 0, parallelism: int = 1, attempt: int = 0) -> TaskInfo:
    return TaskInfo(job_id=job, uid="out", task_index=task, parallelism=parallelism,
                    max_parallelism=128, attempt=attempt)


def test_read_committed_sees_a_checkpoint_only_when_it_completes(kafka_broker):
    """Pre-committed records are not visible to read_committed until the
    completion notice (they go out as they come, the commit flushes them); a
    recovery that finds the marker committed sends nothing again, one that
    does not re-sends the handle's records once."""
    topic = new_topic(kafka_broker, "visible", 2)
    sink = KafkaSink(kafka_broker, topic)
    writer = KafkaTransactionalWriter(sink, _info("vis"))
    writer.restore([])
    writer.write_batch([(str(i), str(i)) for i in range(100)])
    state1 = writer.snapshot_state(1)
    writer.write_batch([(str(i), str(i)) for i in range(100, 150)])  # waits: txn 1 is open
    writer.producer.flush(30)  # on the broker, in the open transaction
    assert len(read_all(kafka_broker, topic, committed=False)) == 100
    assert read_all(kafka_broker, topic) == []
    writer.notify_checkpoint_complete(1)
    assert sorted(int(v) for *_, v in read_all(kafka_broker, topic)) == list(range(100))
    state2 = writer.snapshot_state(2)
    writer.close()  # dies before checkpoint 2 completes: its transaction stays open
    # an attempt restored from checkpoint 1: transaction 1 committed, nothing to redo
    again = KafkaTransactionalWriter(sink, _info("vis", attempt=1))
    again.restore(state1)
    again.close()
    assert len(read_all(kafka_broker, topic)) == 100
    # an attempt restored from checkpoint 2: transaction 2 is redone, once
    for attempt in (2, 3):
        again = KafkaTransactionalWriter(sink, _info("vis", attempt=attempt))
        again.restore(state2)
        again.close()
    values = sorted(int(v) for *_, v in read_all(kafka_broker, topic))
    assert values == list(range(150))


def test_a_zombie_producer_is_fenced_by_the_next_attempt(tmp_path, kafka_broker):
    """A producer with the sink task's transactional id (a zombie of an older
    attempt) has an open transaction; the job's sink initializes the id:
    the zombie's commit fails and its records are never visible."""
    topic = new_topic(kafka_broker, "zombie", 1)
    job = "zombie-job"
    zombie = Producer({"bootstrap.servers": kafka_broker,
                       "transactional.id": transactional_id("lockgate", job, "out", 0)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie")
    zombie.flush(30)
    p = Pipeline("kafka-zombie", parallelism=1,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 500), uid="numbers")
       .sink(KafkaSink(kafka_broker, topic, serializer=lambda x: (None, str(x))), uid="out"))
    result = p.run(launcher="local", job_id=job)
    assert result.status == "finished", result
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal(), fenced.value
    values = [v for *_, v in read_all(kafka_broker, topic)]
    assert b"zombie" not in values
    assert sorted(int(v) for v in values) == list(range(1, 501))


def test_a_full_producer_queue_is_waited_for_and_every_record_goes_once_in_order(
        kafka_broker):
    """The sink's send (one pass through ``map``) on a producer whose local
    queue holds 20 records: it finds the queue full again and again, waits
    for deliveries and sends every record once, in order, from the one
    that did not fit."""

    class Counting:  # the real producer, its full-queue refusals counted
        def __init__(self, producer: Producer) -> None:
            self.producer, self.full = producer, 0

        def produce(self, *args: object) -> None:
            try:
                self.producer.produce(*args)
            except BufferError:
                self.full += 1
                raise

        def poll(self, timeout: float) -> int:
            return self.producer.poll(timeout)

    out = new_topic(kafka_broker, "full-queue", 1)
    producer = Counting(Producer({"bootstrap.servers": kafka_broker, "linger.ms": 0,
                                  "queue.buffering.max.messages": 20}))
    keys = [None if i % 3 == 0 else str(i).encode() for i in range(3_000)]
    values = [f"v{i}".encode() for i in range(3_000)]
    _produce(producer, out, keys, values)
    assert producer.producer.flush(30) == 0
    assert producer.full > 0, "the queue was never full: the test tested nothing"
    assert [(k, v) for _, _, k, v in read_all(kafka_broker, out, committed=False)] == \
        list(zip(keys, values, strict=True))


def test_the_sinks_serializer_output_as_keys_and_values():
    """str encoded, bytes kept, None a null key; any other type or no
    (key, value) pair is refused with the type named."""
    assert _serialized(lambda x: x, [("k", "v"), (None, b"b"), (b"x", bytearray(b"y"))]) == \
        ([b"k", None, b"x"], [b"v", b"b", b"y"])
    assert _serialized(lambda x: (str(x), json.dumps([x])), [1, 2]) == \
        ([b"1", b"2"], [b"[1]", b"[2]"])
    with pytest.raises(TypeError, match="int"):
        _serialized(lambda x: (x, "v"), [1])
    with pytest.raises(ValueError, match="unpack"):
        _serialized(lambda x: ("k", "v", "extra"), [1])


def test_sink_checks_the_broker_and_the_topic_at_start(kafka_broker):
    missing = f"missing-{time.monotonic_ns()}"
    with pytest.raises(ConfigurationError, match="does not exist"):
        KafkaSink(kafka_broker, missing).validate()
    KafkaSink(kafka_broker, missing, create_topic=True, partitions=2).validate()
    KafkaSink(kafka_broker, missing).validate()  # now it exists
    with pytest.raises(ConfigurationError, match="does not exist"):
        KafkaSource(kafka_broker, f"nope-{time.monotonic_ns()}").validate()


def test_at_least_once_sink(tmp_path, kafka_broker):
    """Without failures the at-least-once sink writes every record once; the
    job reports at-least-once."""
    source, out = new_topic(kafka_broker, "alo-in", 2), new_topic(kafka_broker, "alo-out", 2)
    produce_numbers(kafka_broker, source, 1, 2_000, 2)
    result = build(kafka_broker, source, out, parallelism=2, keys=KEYS,
                   storage=str(tmp_path / "chk"), interval=0.2,
                   delivery="at_least_once").run(launcher="local")
    assert result.status == "finished" and result.guarantee == "at_least_once", result
    check_running_sums(sums_of(read_all(kafka_broker, out)), 2_000, KEYS)


# ------------------------------------------------------------ under kills


def _drive_after(cmd: list[str], first: int, *, kills: int, seed: int,
                 timeout: float = 300) -> tuple[dict, int]:
    """Run the driver ``cmd``; once its attempt ``first`` runs (the named
    faults of the attempts before it happened), SIGKILL ``kills`` random
    tasks at random moments. The JobResult it printed and the kills done."""
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = RandomKiller(driver, kills, 4, seed, 0.3, 1.2)

    def start_killer() -> None:
        while driver.poll() is None and not killer.stop.is_set():
            if max((a for a, _ in task_processes(driver.pid).values()), default=-1) >= first:
                killer.start()
                return
            time.sleep(0.01)  # polling /proc: no event to await here

    waiter = threading.Thread(target=start_killer, daemon=True)
    waiter.start()
    try:
        stdout, stderr = driver.communicate(timeout=timeout)
    finally:
        killer.stop.set()
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, f"driver failed ({driver.returncode}):\n{stderr[-4000:]}"
    return json.loads(stdout.strip().splitlines()[-1]), killer.kills


def _sums_under_kills(tmp_path: Path, bootstrap: str, launcher: str, *, n: int, kills: int,
                      faults: list, seed: int, rate: float) -> dict:
    source, out = new_topic(bootstrap, "sums-in", 3), new_topic(bootstrap, "sums-out", 2)
    produce_numbers(bootstrap, source, 1, n, 3)
    cmd = [sys.executable, str(HERE / "kafka_sums_job.py"), "--bootstrap", bootstrap,
           "--input", source, "--output", out, "--parallelism", "2", "--keys", str(KEYS),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", str(rate),
           "--faults", json.dumps(faults), "--launcher", launcher]
    result, done = _drive_after(cmd, len(faults), kills=kills, seed=seed)
    assert result["status"] == "finished", result
    assert result["records_in"] == n, result
    check_running_sums(sums_of(read_all(bootstrap, out)), n, KEYS)
    assert done == kills, f"only {done} of {kills} kills happened"
    return result


def test_exactly_once_under_kills(tmp_path, kafka_broker, launcher):
    """Kafka -> keyed running sums -> KafkaSink, with SIGKILLs of sink tasks
    between pre-commit and commit (``acked``) and on the completion notice
    (``commit``), and of random tasks at random moments: a read_committed
    consumer sees every running sum once."""
    sinks = (2, 3)  # global task numbers of the keyed reduce + sink chain (p=2)
    faults = [{"point": "acked", "task": sinks[0], "attempt": 0, "count": 2},
              {"point": "commit", "task": sinks[1], "attempt": 1, "count": 2}]
    n, kills = (80_000, 8) if SOAK else (24_000, 3)
    result = _sums_under_kills(tmp_path, kafka_broker, launcher, n=n, kills=kills,
                               faults=faults, seed=7, rate=4_000)
    assert result["restarts"] >= 2 + kills - 1, result["failures"]


# ----------------------------------------------------------------- example


def test_example_kafka_sums(tmp_path, kafka_broker, monkeypatch):
    """examples/kafka_sums.py fills its topic once, then each run (``lockgate
    run``, then ``python`` on Spark, each from a folder of its own: run again
    in the same folder, a job resumes its finished run and reads nothing new)
    commits every running sum once."""
    from tests.connectors.kafka_topics import end_offsets
    from tests.integration.test_examples import run_example

    n, seen = 5_000, {}
    monkeypatch.setenv("LOCKGATE_KAFKA", kafka_broker)
    for way in ("lockgate run", "python"):
        folder = tmp_path / way.replace(" ", "-")
        folder.mkdir()
        out = run_example(way, "kafka_sums.py", [str(n)], folder)
        if way == "python":
            assert f"{n} running sums committed" in out.stdout, out.stdout
        records = read_all(kafka_broker, "lockgate-sums")
        fresh = [r for r in records if r[1] >= seen.get(r[0], 0)]
        check_running_sums(sums_of(fresh), n, 10)
        seen = end_offsets(kafka_broker, "lockgate-sums")


def test_the_readers_backlog_is_its_consumer_lag(kafka_broker):
    """What the autoscaler reads of a Kafka source: the records of its
    partitions not read yet (high watermark minus position), measured in
    ``poll`` from the consumer's last fetch, falling as the reader reads."""
    topic = new_topic(kafka_broker, "lag", 2)
    produce_numbers(kafka_broker, topic, 1, 2_000, 2)
    reader = KafkaSource(kafka_broker, topic).create_reader(_info("lag"))
    reader.restore(None)
    try:
        assert reader.backlog() is None  # nothing measured yet
        read = 0
        deadline = time.monotonic() + 60
        while read < 500:
            assert time.monotonic() < deadline, "no records within 60 s"
            read += len(reader.poll(100) or [])
        time.sleep(1.1)  # (the lag is measured at most once a second)
        lags = []
        while not lags or lags[-1] is None:
            assert time.monotonic() < deadline, "no lag measured within 60 s"
            read += len(reader.poll(1) or [])
            lags.append(reader.backlog())
        assert lags[-1] == 2_000 - read, (lags, read)
        while read < 2_000:
            assert time.monotonic() < deadline, "not every record within 60 s"
            read += len(reader.poll(500) or [])
        time.sleep(1.1)
        reader.poll(1)
        assert reader.backlog() == 0
    finally:
        reader.close()
