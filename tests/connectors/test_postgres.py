"""PostgreSQL sinks against a real server: the two-phase-commit sink
(``PostgresSink``) on a throwaway cluster with ``max_prepared_transactions``
> 0 (``postgres_2pc``; or ``LOCKGATE_TEST_POSTGRES_2PC``), the refusal of a
server without prepared transactions and the upsert sink on the shared
server (``LOCKGATE_TEST_POSTGRES``).

Every job runs as a driver subprocess (``tests/connectors/pg_sums_job.py``)
SIGKILLed at random moments and at named protocol points, on both launchers;
the table must then hold exactly the expected rows, and ``pg_prepared_xacts``
nothing of the job. ``LOCKGATE_SOAK=1`` runs longer kill campaigns.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from pathlib import Path

import pytest

from lockgate.connectors import PostgresSink, PostgresUpsertSink
from lockgate.connectors.base import TaskInfo
from lockgate.errors import ConfigurationError
from tests.connectors.postgres_server import execute, prepared, query
from tests.fault.checks import drive
from tests.fixtures import check_running_sums

JOB = Path(__file__).parent / "pg_sums_job.py"
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))
PARALLELISM = 2
SINK_TASK = PARALLELISM  # tasks 0..p-1: numbers -> pairs; p..2p-1: sums -> out


def new_table(dsn: str, columns: str = "k bigint NOT NULL, s bigint NOT NULL") -> str:
    name = f"lg_{uuid.uuid4().hex[:10]}"
    execute(dsn, f"CREATE TABLE {name} ({columns})")
    return name


def run_sums(tmp_path: Path, dsn: str, table: str, *, n: int, launcher: str, faults=(),
             kills: int = 0, seed: int = 0, rate: float = 0.0, keys: int = 5,
             uid: str = "out", extra: tuple[str, ...] = ()) -> dict:
    import json

    cmd = [sys.executable, str(JOB), "--sink", "pg2pc", "--n", str(n), "--keys", str(keys),
           "--dsn", dsn, "--table", table, "--uid", uid, "--storage", str(tmp_path / "chk"),
           "--parallelism", str(PARALLELISM), "--interval", "0.2", "--rate", str(rate),
           "--faults", json.dumps(list(faults)), "--launcher", launcher, *extra]
    result, done = drive(cmd, kills=kills, tasks=2 * PARALLELISM, seed=seed,
                         kill_delays=(0.3, 1.2), timeout=300)
    assert done == kills, f"only {done} of {kills} kills happened"
    assert result["status"] == "finished", result
    return result


def check_table(dsn: str, table: str, n: int, keys: int, uid: str = "out") -> None:
    """Every running sum once, nothing else, and no prepared transaction left."""
    rows = query(dsn, f"SELECT k, s FROM {table}")
    check_running_sums([list(r) for r in rows], n, keys)
    assert prepared(dsn, uid) == [], "prepared transactions were left behind"


# ------------------------------------------------------------ refusals


def test_validate_refuses_a_server_without_prepared_transactions(postgres_dsn):
    table = new_table(postgres_dsn)
    try:
        with pytest.raises(ConfigurationError, match="max_prepared_transactions.*restart"):
            PostgresSink(postgres_dsn, table, ["k", "s"]).validate()
    finally:
        execute(postgres_dsn, f"DROP TABLE {table}")


def test_validate_names_a_missing_table_or_column(postgres_2pc):
    with pytest.raises(ConfigurationError, match="does not exist"):
        PostgresSink(postgres_2pc, "no_such_table", ["k"]).validate()
    table = new_table(postgres_2pc)
    with pytest.raises(ConfigurationError, match=r"no column\(s\) \['x'\]"):
        PostgresSink(postgres_2pc, table, ["k", "x"]).validate()
    PostgresSink(postgres_2pc, table, ["k", "s"]).validate()


# ------------------------------------------------- the writer, step by step


def test_prepared_rows_are_invisible_until_committed_and_a_restore_resolves_them(postgres_2pc):
    dsn = postgres_2pc
    table = new_table(dsn)
    sink = PostgresSink(dsn, table, ["k", "s"])
    w = sink.create_writer(TaskInfo("job-a", "w1", 0, 1, 128, 0))
    w.restore([])
    w.write_batch([(1, 10), {"k": 2, "s": 20}])
    state1 = w.snapshot_state(1)
    w.write_batch([(3, 30)])
    state2 = w.snapshot_state(2)
    assert query(dsn, f"SELECT count(*) FROM {table}") == [(0,)]
    assert len(prepared(dsn, "w1")) == 2
    w.notify_checkpoint_complete(1)
    assert sorted(query(dsn, f"SELECT k, s FROM {table}")) == [(1, 10), (2, 20)]
    w.write_batch([(4, 40)])  # an open transaction, never prepared
    w.close()  # killed after checkpoint 2 was taken: as if restored from checkpoint 1 ...
    w = sink.create_writer(TaskInfo("job-b", "w1", 0, 1, 128, 1))
    w.restore(state1)  # ... whose handle is committed already: checkpoint 2's is rolled back
    assert sorted(query(dsn, f"SELECT k, s FROM {table}")) == [(1, 10), (2, 20)]
    assert prepared(dsn, "w1") == []
    w.commit(w.decode_entry(state1[0]))  # idempotent
    from lockgate.errors import OutputLostError

    with pytest.raises(OutputLostError, match="lost"):  # rolled back: never taken as committed
        w.commit(w.decode_entry(state2[-1]))
    w.close()


# ------------------------------------------------------- jobs under kills


def test_a_reader_never_sees_rows_of_a_checkpoint_that_is_rolled_back(tmp_path, postgres_2pc):
    """The sink task dies after PREPARE and before its ack (``snapshot``):
    that checkpoint never completes and its prepared transaction is rolled
    back. A READ COMMITTED reader polling throughout sees only rows of
    transactions that committed; it saw that transaction prepared."""
    import psycopg

    dsn, n, keys = postgres_2pc, 30_000, 5
    table = new_table(dsn)
    seen_rows: set[tuple] = set()
    seen_prepared: dict[str, int] = {}
    stop = threading.Event()

    def reader() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                for row in conn.execute(f"SELECT xmin::text::bigint, k, s FROM {table}"):
                    seen_rows.add(tuple(row))
                for gid, xid in conn.execute("SELECT gid, transaction::text::bigint "
                                             "FROM pg_prepared_xacts"):
                    seen_prepared[gid] = xid
                stop.wait(0.02)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        faults = [{"point": "snapshot", "task": SINK_TASK, "attempt": 0, "count": 4},
                  {"point": "snapshot", "task": SINK_TASK + 1, "attempt": 1, "count": 3}]
        result = run_sums(tmp_path, dsn, table, n=n, keys=keys, launcher="local",
                          faults=faults, rate=5000)
    finally:
        stop.set()
        thread.join(10)
    assert result["restarts"] == 2, result["failures"]
    check_table(dsn, table, n, keys)
    final = {tuple(r) for r in query(dsn, f"SELECT xmin::text::bigint, k, s FROM {table}")}
    assert seen_rows and seen_rows <= final, f"seen, never committed: {seen_rows - final}"
    statuses = {gid: query(dsn, "SELECT pg_xact_status(%s::text::xid8)", (str(xid),))[0][0]
                for gid, xid in seen_prepared.items() if ":out:" in gid}
    rolled_back = {xid for gid, xid in seen_prepared.items() if statuses.get(gid) == "aborted"}
    assert rolled_back, f"no prepared transaction was rolled back: {statuses}"
    assert not rolled_back & {xmin for xmin, _, _ in seen_rows}


def test_named_points_between_pre_commit_and_commit(tmp_path, postgres_2pc, launcher):
    """Killed after the ack (``acked``: the checkpoint completes without the
    sink), after the completion notice and before COMMIT PREPARED
    (``commit``): each next attempt commits the prepared transactions of the
    restored checkpoint exactly once and rolls back the others; a random
    kill follows. (After PREPARE and before the ack: the reader's test.)"""
    dsn, n, keys = postgres_2pc, 16_000, 5
    table = new_table(dsn)
    faults = [{"point": "acked", "task": SINK_TASK, "attempt": 0, "count": 2},
              {"point": "commit", "task": SINK_TASK + 1, "attempt": 1, "count": 2}]
    result = run_sums(tmp_path, dsn, table, n=n, keys=keys, launcher=launcher, faults=faults,
                      rate=4000, kills=1, seed=1)
    assert result["restarts"] >= len(faults), result["failures"]
    check_table(dsn, table, n, keys)


@pytest.mark.parametrize("seed", [3] + ([4, 5, 6] if SOAK else []))
def test_random_kills(tmp_path, postgres_2pc, launcher, seed):
    dsn, n, keys = postgres_2pc, (120_000 if SOAK else 30_000), 7
    table = new_table(dsn)
    kills = 8 if SOAK else 3
    result = run_sums(tmp_path, dsn, table, n=n, keys=keys, launcher=launcher, kills=kills,
                      seed=seed, rate=5000)
    assert result["restarts"] >= kills - 1
    check_table(dsn, table, n, keys)


# ---------------------------------------------------------- upsert sink


def test_upsert_sink_refuses_a_table_without_a_unique_key(postgres_dsn):
    table = new_table(postgres_dsn)
    try:
        with pytest.raises(ConfigurationError, match="no unique index"):
            PostgresUpsertSink(postgres_dsn, table, ["k"]).validate()
    finally:
        execute(postgres_dsn, f"DROP TABLE {table}")


@pytest.mark.parametrize("method", ["copy", "values"])
def test_upsert_sink_last_write_per_key_wins(postgres_dsn, method):
    dsn = postgres_dsn
    table = new_table(dsn, "k text, part int, v bigint, note text, PRIMARY KEY (k, part)")
    try:
        sink = PostgresUpsertSink(dsn, table, ["k", "part"], ["k", "part", "v"], method=method,
                                  batch_rows=2)
        sink.validate()
        w = sink.create_writer(TaskInfo("j", "up", 0, 1, 128, 0))
        w.restore([])
        w.write_batch([("a", 1, 1), ("b", 1, 2), {"k": "a", "part": 1, "v": 3}, ("a", 2, 4)])
        assert w.snapshot_state(1) == []
        w.write_batch([("b", 1, 5)])
        w.close()  # not flushed: a replay writes it again
        assert sorted(query(dsn, f"SELECT k, part, v, note FROM {table}")) == [
            ("a", 1, 3, None), ("a", 2, 4, None), ("b", 1, 2, None)]
    finally:
        execute(dsn, f"DROP TABLE {table}")


# --------------------------------------------------------------- example


def test_example_postgres_sums(tmp_path, postgres_2pc, monkeypatch):
    """``examples/postgres_sums.py`` as ``lockgate run`` runs it: every
    running (count, sum) per remainder once, nothing left prepared."""
    from tests.integration.test_examples import run_example

    table = f"lg_ex_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("POSTGRES_DSN", postgres_2pc)
    monkeypatch.setenv("POSTGRES_TABLE", table)
    out = run_example("lockgate run", "postgres_sums.py", ["5000"], tmp_path)
    assert "5000 records in, 5000 out" in out.stdout, out.stdout
    rows = query(postgres_2pc, f"SELECT remainder, count, sum FROM {table}")
    check_running_sums([[r, s] for r, _, s in rows], 5000, 100)
    assert sorted((r, c) for r, c, _ in rows) == [(r, c) for r in range(100)
                                                   for c in range(1, 51)]
    assert prepared(postgres_2pc, "out") == []
