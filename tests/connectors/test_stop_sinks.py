"""Stop with a savepoint, with and without drain, into the real systems'
sinks (PostgreSQL two-phase commit, Kafka transactions, JetStream
write-ahead): once the job has ended nothing is left prepared, open or
unsent, the committed output is exactly the records the job reported out,
and a job resumed from the savepoint to the end of its input (its sinks
commit the savepoint's transactions again, idempotently) leaves exactly the
expected running sums, record by record. On both launchers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import JetStreamSink, PostgresSink, SequenceSource
from tests.connectors.kafka_server import kafka_broker_fixture  # noqa: F401 - kafka_broker
from tests.connectors.nats_server import make_stream, stream_payloads, unique
from tests.connectors.postgres_server import execute, prepared, query
from tests.fault.held_source import HeldSequence
from tests.fixtures import check_running_sums, start_and_await

N, KEYS = 30_000, 5


def _job(tmp: Path, sink: Any, rate: float | None) -> Pipeline:
    """Rate-limited, the job to stop: its source never ends its input by
    itself (the stop cannot come after the end, however slow the machine);
    else the resumed job, which reads the rest to the end."""
    p = Pipeline("stop-sinks", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")),
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0))
    source = HeldSequence(1, N, rate=rate) if rate else SequenceSource(1, N)
    (p.source(source, uid="numbers")
       .map(lambda x: (x % KEYS, x), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(sink, uid="out"))
    return p


def _postgres(dsn: str) -> tuple[Any, Callable[[], list[list[int]]], Callable[[], None]]:
    table = f"lg_stop_{unique('t').lower()}"
    execute(dsn, f"CREATE TABLE {table} (k bigint NOT NULL, s bigint NOT NULL)")

    def rows() -> list[list[int]]:
        return [list(r) for r in query(dsn, f"SELECT k, s FROM {table}")]

    def settled() -> None:
        assert prepared(dsn, "out") == [], "prepared transactions were left"
    return PostgresSink(dsn, table, ["k", "s"]), rows, settled


def _kafka(bootstrap: str) -> tuple[Any, Callable[[], list[list[int]]], Callable[[], None]]:
    from lockgate.connectors.kafka import KafkaSink
    from tests.connectors.kafka_topics import end_offsets, new_topic, read_all, sums_of

    topic = new_topic(bootstrap, "stop", 1)

    def rows() -> list[list[int]]:
        return sums_of(read_all(bootstrap, topic))

    def settled() -> None:  # no open transaction holds the last stable offset back
        assert end_offsets(bootstrap, topic) == end_offsets(bootstrap, topic, committed=False)
    return (KafkaSink(bootstrap, topic, serializer=lambda kv: (str(kv[0]), json.dumps(kv))),
            rows, settled)


def _jetstream(url: str) -> tuple[Any, Callable[[], list[list[int]]], Callable[[], None]]:
    name = unique("STOP")
    make_stream(url, name, [f"{name}.out"])

    def rows() -> list[list[int]]:
        return [json.loads(p) for p in stream_payloads(url, name)]
    return JetStreamSink(f"{name}.out", url=url), rows, lambda: None


SINKS = {"postgres": ("postgres_2pc", _postgres), "kafka": ("kafka_broker", _kafka),
         "jetstream": ("nats_url", _jetstream)}


@pytest.mark.parametrize("drain", [False, True], ids=["no-drain", "drain"])
@pytest.mark.parametrize("system", list(SINKS))
def test_stop_commits_and_the_savepoint_resumes_exactly(
        tmp_path: Path, launcher: str, system: str, drain: bool,
        request: pytest.FixtureRequest) -> None:
    fixture, make = SINKS[system]
    sink, rows, settled = make(request.getfixturevalue(fixture))
    client = start_and_await(_job(tmp_path, sink, rate=4000), launcher=launcher,
                             until=lambda p: p.checkpoints_completed >= 2)
    result = client.stop(str(tmp_path / "sp"), drain=drain)
    assert result.status == ("finished" if drain else "stopped"), result
    assert 0 < result.records_in < N, "the job ended before it was stopped (too slow?)"
    settled()
    committed = rows()
    assert len(committed) == result.records_out == result.records_in
    check_running_sums(committed, 0, KEYS, inputs=_read_numbers(result.savepoint))
    # resumed to the end: the savepoint's transactions are not committed twice
    resumed = _job(tmp_path, sink, rate=None).run(launcher=launcher,
                                                  from_savepoint=result.savepoint)
    assert resumed.status == "finished" and resumed.records_in == N, resumed
    settled()
    check_running_sums(rows(), N, KEYS)


def _read_numbers(savepoint: str | None) -> list[int]:
    from tests.fixtures import sequence_read

    assert savepoint is not None
    return sequence_read(savepoint, N)


def test_a_stopped_jobs_write_ahead_records_are_not_sent_again_after_the_window(
        tmp_path: Path, launcher: str, nats_url: str) -> None:
    """JetStream drops a repeated message id only within its duplicate window:
    the stop marks its savepoint committed once every task sent its records,
    so a job resumed from it after the window has passed sends none again."""
    name = unique("STOPWIN")
    window = 1.0
    make_stream(nats_url, name, [f"{name}.out"], duplicate_window=window)
    sink = JetStreamSink(f"{name}.out", url=nats_url, min_duplicate_window=window / 2)
    client = start_and_await(_job(tmp_path, sink, rate=4000), launcher=launcher,
                             until=lambda p: p.checkpoints_completed >= 2)
    result = client.stop(str(tmp_path / "sp"))
    assert result.status == "stopped" and len(stream_payloads(nats_url, name)) == \
        result.records_out
    time.sleep(2 * window)  # the stream forgets the ids it saw: that is what is tested
    resumed = _job(tmp_path, sink, rate=None).run(launcher=launcher,
                                                  from_savepoint=result.savepoint)
    assert resumed.status == "finished" and resumed.records_in == N, resumed
    check_running_sums([json.loads(p) for p in stream_payloads(nats_url, name)], N, KEYS)
