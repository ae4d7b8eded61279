"""Redis connectors against a real server (``LOCKGATE_TEST_REDIS``, default
``redis://127.0.0.1:6379/0``): the stream source (positions, bounds, rescale)
and the upsert sink; and the fault-injection run Redis Streams -> keyed
running aggregates -> upsert sinks (Redis and PostgreSQL) with SIGKILLs at
named points and random moments, on both launchers, compared with the
expected values record by record. Every test uses keys of its own prefix.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import CollectSink, RedisStreamSource, RedisUpsertSink
from lockgate.connectors.base import TaskInfo
from lockgate.errors import ConfigurationError
from tests.connectors.postgres_server import execute, query
from tests.connectors.redis_server import delete_keys, fill_streams
from tests.fault.checks import drive

JOB = Path(__file__).parent / "pg_sums_job.py"
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))


@pytest.fixture
def prefix(redis_url) -> Iterator[str]:
    """A key prefix of this test's own, deleted afterwards."""
    name = f"lgtest:{uuid.uuid4().hex[:10]}:"
    yield name
    delete_keys(redis_url, name + "*")


def client(url: str):
    import redis

    return redis.Redis.from_url(url, decode_responses=True)


def info(task: int, p: int, attempt: int = 0) -> TaskInfo:
    return TaskInfo("job", "src", task, p, 128, attempt)


def read_all(source: RedisStreamSource, p: int, state: list | None, stop_after: int | None = None
             ) -> tuple[list, list]:
    """Read with ``p`` readers restored from ``state`` (union: every reader
    gets all of it), at most ``stop_after`` polls each; the records and the
    union of their snapshots."""
    records, snapshot = [], []
    for i in range(p):
        reader = source.create_reader(info(i, p))
        reader.restore(None if state is None else list(state))
        polls = 0
        while stop_after is None or polls < stop_after:
            batch = reader.poll(3)
            polls += 1
            if batch is None:
                break
            records += batch
        snapshot += reader.snapshot_state(1)
        reader.close()
    return records, snapshot


# ------------------------------------------------------------- the source


def test_a_bounded_source_reads_up_to_the_end_fixed_at_start_and_rescales(redis_url, prefix):
    streams = [f"{prefix}s{i}" for i in range(3)]
    fill_streams(redis_url, streams, 30)
    source = RedisStreamSource(redis_url, streams, bounded=True)
    source.prepare("", "src")
    c = client(redis_url)
    c.xadd(streams[0], {"x": 999})  # after the start: not read by a bounded source
    # 2 tasks read a little, then the rest is read by 3 tasks, then by 1
    first, state = read_all(source, 2, None, stop_after=2)
    second, state = read_all(source, 3, state, stop_after=3)
    third, state = read_all(source, 1, state)
    xs = [int(e.fields["x"]) for e in first + second + third]
    assert sorted(xs) == list(range(1, 31)), xs
    assert all(e.stream == streams[x % 3] for e, x in zip(first + second + third, xs,
                                                          strict=True))
    assert {s["stream"] for s in state} == set(streams)
    again, _ = read_all(source, 2, state)
    assert again == []


def test_an_unbounded_source_resumes_after_its_position_and_reads_new_entries(redis_url, prefix):
    stream = prefix + "s"
    c = client(redis_url)
    for x in range(5):
        c.xadd(stream, {"x": x})
    source = RedisStreamSource(redis_url, [stream, prefix + "empty"], start="0")
    source.prepare("", "src")
    records, state = read_all(source, 1, None, stop_after=4)
    assert [e.fields["x"] for e in records] == ["0", "1", "2", "3", "4"]
    c.xadd(stream, {"x": 5})
    records, state = read_all(source, 2, state, stop_after=2)
    assert [e.fields["x"] for e in records] == ["5"]
    late = RedisStreamSource(redis_url, stream, start="$")
    late.prepare("", "src")
    c.xadd(stream, {"x": 6})
    records, _ = read_all(late, 1, None, stop_after=2)
    assert [e.fields["x"] for e in records] == ["6"]


def test_a_bounded_job_reads_every_entry_once(tmp_path, redis_url, prefix):
    streams = [f"{prefix}s{i}" for i in range(3)]
    fill_streams(redis_url, streams, 3000)
    p = Pipeline("redis-read", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    out = CollectSink(str(tmp_path / "out"))
    (p.source(RedisStreamSource(redis_url, streams, bounded=True), uid="src")
       .map(lambda e: (e.stream, e.id, int(e.fields["x"])), uid="rows")
       .sink(out, uid="out"))
    result = p.run(launcher="local")
    assert result.guarantee == "exactly_once"
    rows = out.results()
    assert sorted(x for _, _, x in rows) == list(range(1, 3001))
    assert len({(s, i) for s, i, _ in rows}) == 3000


def test_validate_names_an_unreachable_server():
    with pytest.raises(ConfigurationError, match="cannot reach Redis"):
        RedisStreamSource("redis://127.0.0.1:1/0", "s").validate()
    with pytest.raises(ConfigurationError, match="cannot reach Redis"):
        RedisUpsertSink("redis://:secret@127.0.0.1:1/0").validate()


# ------------------------------------------------------------ the upsert sink


def test_upsert_sink_writes_the_last_value_per_key_at_the_snapshot(redis_url, prefix):
    c = client(redis_url)
    strings = RedisUpsertSink(redis_url, prefix=prefix + "str:")
    w = strings.create_writer(TaskInfo("j", "up", 0, 1, 128, 0))
    w.restore([])
    w.write_batch([("a", 1), ("b", 2), ("a", 3)])
    assert c.get(prefix + "str:a") is None  # buffered until the snapshot
    assert w.snapshot_state(1) == []
    assert (c.get(prefix + "str:a"), c.get(prefix + "str:b")) == ("3", "2")
    w.close()
    hashes = RedisUpsertSink(redis_url, kind="hash", prefix=prefix + "h:", replace=True,
                             key=lambda r: r["id"], value=lambda r: r["fields"])
    w = hashes.create_writer(TaskInfo("j", "up", 0, 1, 128, 0))
    w.restore([])
    w.write_batch([{"id": 1, "fields": {"n": 1, "old": "x"}}])
    w.snapshot_state(1)
    w.write_batch([{"id": 1, "fields": {"n": 2}}])
    w.finish()
    assert c.hgetall(prefix + "h:1") == {"n": "2"}
    w.close()


# ------------------------------------------------------- jobs under kills


def expected_sums(n: int, streams: int) -> dict[tuple[int, int], int]:
    """``(key, count) -> running sum`` for every number of ``1..n``, key
    ``x % streams``, in order."""
    out: dict[tuple[int, int], int] = {}
    count: dict[int, int] = {}
    total: dict[int, int] = {}
    for x in range(1, n + 1):
        k = x % streams
        count[k] = count.get(k, 0) + 1
        total[k] = total.get(k, 0) + x
        out[(k, count[k])] = total[k]
    return out


def test_streams_to_upsert_sinks_under_kills(tmp_path, redis_url, postgres_dsn, prefix,
                                             launcher):
    """Redis Streams -> running (count, sum) per key -> upserts by (key, count)
    into PostgreSQL and Redis, and the final (count, sum) per key as Redis
    hashes: kills between pre-commit and commit (``acked``), after the
    completion notice (``commit``), at a snapshot and at random moments; the
    targets then hold exactly every expected value, nothing else."""
    n, n_streams, p = (60_000 if SOAK else 12_000), 4, 2
    streams = [f"{prefix}in{i}" for i in range(n_streams)]
    fill_streams(redis_url, streams, n)
    table = f"lg_up_{uuid.uuid4().hex[:10]}"
    execute(postgres_dsn, f"CREATE TABLE {table} (k bigint, c bigint, s bigint, "
                          "PRIMARY KEY (k, c))")
    faults = [{"point": "acked", "task": p, "attempt": 0, "count": 2},
              {"point": "commit", "task": p + 1, "attempt": 1, "count": 2}]
    kills = 4 if SOAK else 1
    cmd = [sys.executable, str(JOB), "--source", "redis", "--sink", "upsert",
           "--streams", ",".join(streams), "--redis", redis_url, "--redis-out",
           "--prefix", prefix + "out:", "--dsn", postgres_dsn, "--table", table,
           "--storage", str(tmp_path / "chk"), "--parallelism", str(p), "--interval", "0.2",
           "--rate", "3000", "--faults", json.dumps(faults), "--launcher", launcher]
    try:
        result, done = drive(cmd, kills=kills, tasks=2 * p, seed=11, kill_delays=(0.3, 1.2),
                             timeout=300)
        assert done == kills and result["status"] == "finished", result
        assert result["restarts"] >= len(faults), result["failures"]
        assert result["guarantee"] == "exactly_once"
        expected = expected_sums(n, n_streams)
        rows = {(k, c): s for k, c, s in query(postgres_dsn, f"SELECT k, c, s FROM {table}")}
        assert rows == expected, "PostgreSQL upserts differ from the expected running sums"
        c = client(redis_url)
        got = {}
        for key in c.scan_iter(match=prefix + "out:*:*", count=1000):
            k, count = key[len(prefix + "out:"):].split(":")
            if k != "final":
                got[(int(k), int(count))] = int(c.get(key))
        assert got == expected, "Redis upserts differ from the expected running sums"
        for k in range(n_streams):
            count = max(c_ for k_, c_ in expected if k_ == k)
            assert c.hgetall(f"{prefix}out:final:{k}") == {
                "count": str(count), "sum": str(expected[(k, count)])}
    finally:
        execute(postgres_dsn, f"DROP TABLE IF EXISTS {table}")


def test_example_redis_upsert(tmp_path, redis_url, prefix, monkeypatch):
    """``examples/redis_upsert.py`` as ``lockgate run`` runs it (keys of its
    own prefix): the final (count, sum) per remainder."""
    from tests.integration.test_examples import run_example

    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("REDIS_PREFIX", prefix)
    out = run_example("lockgate run", "redis_upsert.py", ["4000"], tmp_path)
    assert "4000 records in" in out.stdout, out.stdout
    c = client(redis_url)
    for r in range(10):
        assert c.hgetall(f"{prefix}sums:{r}") == {
            "count": "400", "sum": str(sum(x for x in range(1, 4001) if x % 10 == r))}
