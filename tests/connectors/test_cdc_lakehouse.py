"""The flagship under SIGKILL: a PostgreSQL table that a writer changes
(inserts, updates that add 1 to ``version``, moves to another region,
deletes) mirrored by ``PostgresCdcSource`` into a Delta table and an Iceberg
table (merge by ``id``, partitioned by ``region``) and a Delta change log
(every event appended), on both launchers.

Kills strike at the named protocol points (the table commit ready but not
made, made but not noted, the completion notice before the sinks commit and
the slot advances, a snapshot not yet acknowledged) and at random moments
from outside. At the end both mirrors equal the source table row for row;
the change log holds every version of every row once and every delete once
(a change applied twice or lost shows there); each checkpoint is committed
once to each table; no staged file is left.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.connectors.cdc_checks import Stopper
from tests.connectors.postgres_server import execute, query
from tests.connectors.test_postgres_cdc import Writer
from tests.fault.checks import drive

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

JOB = Path(__file__).parent / "cdc_lake_job.py"
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))
REGIONS = ["eu", "us", "apac"]
COLUMNS = ["id", "name", "region", "balance", "version"]
# the job's tasks, two per vertex (global numbers): 0-1 the source, 2-3 the
# rows, 4-5 the Delta mirror, 6-7 the Iceberg mirror, 8-9 the change log; the
# records flow through the first task of each, the sinks' committers
SOURCE, DELTA, ICEBERG, LOG, TASKS = 0, 4, 6, 8, 10
PACE = 0.02
"""Seconds between the writer's transactions (2.5 changes each, on average)."""


@pytest.fixture
def names(postgres_logical) -> Iterator[tuple[str, str]]:
    """A customers table and a slot name of this test's own; both dropped
    afterwards."""
    tag = uuid.uuid4().hex[:10]
    table, slot = f"customers_{tag}", f"lg_{tag}"
    execute(postgres_logical,
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text NOT NULL, "
            "region text NOT NULL, balance bigint NOT NULL, version int NOT NULL)")
    yield table, slot
    execute(postgres_logical,
            f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{slot}'",
            f"DROP PUBLICATION IF EXISTS {slot}", f"DROP TABLE IF EXISTS {table}")


class CustomerWriter(Writer):
    """Inserts customers, updates balances (``version + 1``), moves customers
    to another region (``version + 1``) and deletes some, a few changes per
    transaction, until stopped; then the stop message."""

    def step(self, conn: Any) -> None:
        t, rng = self.table, self.rng
        with conn.transaction():
            for _ in range(rng.randint(1, 4)):
                r, who = rng.random(), rng.randint(1, self.next_id)
                if r < 0.25:
                    conn.execute(f"INSERT INTO {t} VALUES (%s, %s, %s, 0, 0)",
                                 (self.next_id, f"new {self.next_id}", rng.choice(REGIONS)))
                    self.next_id += 1
                elif r < 0.75:
                    conn.execute(f"UPDATE {t} SET balance = balance + %s, version = version + 1 "
                                 "WHERE id = %s", (rng.randint(-50, 100), who))
                elif r < 0.9:
                    conn.execute(f"UPDATE {t} SET region = %s, version = version + 1 "
                                 "WHERE id = %s", (rng.choice(REGIONS), who))
                else:
                    conn.execute(f"DELETE FROM {t} WHERE id = %s", (who,))
        self.ops += 1
        self.stop.wait(PACE)  # a steady load the job keeps up with, killed or not


def fill(dsn: str, table: str, n: int) -> None:
    execute(dsn, f"INSERT INTO {table} SELECT i, 'customer ' || i, "
                 f"(ARRAY['eu', 'us', 'apac'])[i % 3 + 1], 0, 0 FROM generate_series(1, {n}) i")


def run_flagship(tmp: Path, dsn: str, table: str, slot: str, launcher: str, *, n: int,
                 write_s: float, faults: list | None = None, kills: int = 0,
                 seed: int = 0) -> tuple[dict, int]:
    """Fill the table, start the writer and run the job to the writer's stop
    message under the faults and random kills. The writer writes at least
    ``write_s`` seconds, until every random kill landed and the attempt
    after the last kill (random, or one per attempt at the named points) runs."""
    from lockgate.connectors import PostgresCdcSource

    fill(dsn, table, n)
    (tmp / "lake").mkdir()
    cmd = [sys.executable, str(JOB), "--dsn", dsn, "--table", table, "--slot", slot,
           "--lake", str(tmp / "lake"), "--storage", str(tmp / "chk"), "--parallelism", "2",
           "--chunk", "500", "--rate", "3000", "--interval", "0.3",
           "--faults", json.dumps(faults or []), "--launcher", launcher]
    # the slot first (the job finds it): it holds every change of the writer
    PostgresCdcSource(dsn, [table], slot=slot).prepare("", "cdc")
    with CustomerWriter(dsn, table, n + 1, seed=seed).running() as writer:
        stopper = Stopper(writer, after=write_s, attempt=len(faults or []), limit=write_s + 240)
        result, done = drive(cmd, kills=kills, tasks=TASKS, seed=seed,
                             kill_delays=(0.5, 2.5), timeout=600, watcher=stopper)
    assert writer.ops > 20
    assert result["status"] == "finished", result
    return result, done


def check_mirrors(tmp: Path, dsn: str, table: str) -> None:
    """Both mirrors equal the table row for row; the change log has every
    version of every row once and every delete once; each checkpoint is
    committed once per table; no staged file is left."""
    from pyiceberg.catalog import load_catalog

    from tests.connectors.cdc_lake_job import catalog

    lake = tmp / "lake"
    want = sorted(query(dsn, f"SELECT {', '.join(COLUMNS)} FROM {table}"))
    assert len({r[0] for r in want}) == len(want)
    delta = deltalake.DeltaTable(str(lake / "customers"))
    iceberg = load_catalog("lockgate", **catalog(str(lake))).load_table("crm.customers")
    for name, got in (("delta", delta.to_pyarrow_table()), ("iceberg", iceberg.scan().to_arrow())):
        rows = sorted(tuple(r[c] for c in COLUMNS) for r in got.to_pylist())
        missing, extra = set(want) - set(rows), set(rows) - set(want)
        assert rows == want, (f"{name}: {len(rows)} rows, the table {len(want)}; "
                              f"{len(missing)} missing or stale, {len(extra)} extra or stale: "
                              f"{sorted(extra)[:5]} for {sorted(missing)[:5]}")
    # the change log: per row, each version once, contiguous; each delete once
    versions: dict[int, list[int]] = {}
    deletes: Counter[int] = Counter()
    for c in deltalake.DeltaTable(str(lake / "changes")).to_pyarrow_table().to_pylist():
        if c["op"] == "delete":
            deletes[c["id"]] += 1
        else:
            versions.setdefault(c["id"], []).append(c["version"])
    for rid, vs in versions.items():
        assert sorted(vs) == list(range(min(vs), max(vs) + 1)), \
            f"id {rid}: versions {sorted(vs)} (a change applied twice or lost)"
    assert all(k == 1 for k in deletes.values()), {i: k for i, k in deletes.items() if k > 1}
    last = {rid: max(vs) for rid, vs in versions.items() if rid not in deletes}
    assert last == {r[0]: r[4] for r in want}
    # each checkpoint once per table, in order
    from tests.fault.test_lakehouse import delta_commits
    by_commit: dict[str, tuple[str, int]] = {}  # a commit's snapshots share its nonce
    for snap in iceberg.metadata.snapshots:
        props = snap.summary.additional_properties
        for k, v in props.items():
            if k.startswith("lockgate.checkpoint."):
                by_commit[props["lockgate.commit"]] = (k[len("lockgate.checkpoint."):], int(v))
    commits = {"delta": delta_commits(lake / "customers"), "log": delta_commits(lake / "changes"),
               "iceberg": list(by_commit.values())}
    for name, txns in commits.items():
        assert txns, name
        assert len(txns) == len(set(txns)), f"{name}: a checkpoint committed twice: {txns}"
        for app in {a for a, _ in txns}:
            cids = [c for a, c in txns if a == app]
            assert cids == sorted(cids), (name, cids)
    staged = [p for p in lake.rglob("_lockgate/**/*")
              if p.is_file() and ".lockgate-probe" not in p.name]
    assert not staged, f"staged files left behind: {staged}"
    assert delta.metadata().partition_columns == ["region"]
    assert [f.name for f in iceberg.spec().fields] == ["region"]


def test_flagship_kills_at_protocol_points(tmp_path, postgres_logical, names, launcher):
    """One kill per attempt, each at another named point of the protocol:
    the Delta mirror's table commit ready, not made; the Iceberg mirror's
    made, not noted (with LOCKGATE_SOAK both points for both formats); the
    completion notice arrived at the source, the slot not advanced; the
    change log's file staged, not acknowledged."""
    table, slot = names
    points = [("table_commit", DELTA, 2), ("table_committed", ICEBERG, 3),
              ("commit", SOURCE, 2), ("snapshot", LOG, 2)]
    if SOAK:  # and the other format at each point of the table commit
        points[1:1] = [("table_commit", ICEBERG, 2), ("table_committed", DELTA, 2)]
    faults = [{"point": point, "task": task, "attempt": attempt, "count": count}
              for attempt, (point, task, count) in enumerate(points)]
    result, _ = run_flagship(tmp_path, postgres_logical, table, slot, launcher,
                             n=6000 if SOAK else 2000, write_s=30 if SOAK else 3,
                             faults=faults, seed=3)
    assert result["restarts"] == len(faults), result["failures"]
    check_mirrors(tmp_path, postgres_logical, table)


def test_flagship_random_kills(tmp_path, postgres_logical, names, launcher):
    """SIGKILL random tasks at random moments, from outside, while the
    snapshot is read and while the changes stream."""
    table, slot = names
    kills = 6 if SOAK else 2
    result, done = run_flagship(tmp_path, postgres_logical, table, slot, launcher,
                                n=6000 if SOAK else 2000, write_s=40 if SOAK else 3,
                                kills=kills, seed=11)
    assert done == kills, f"only {done} kills happened"
    assert result["restarts"] >= kills - 1, result["failures"]
    check_mirrors(tmp_path, postgres_logical, table)
