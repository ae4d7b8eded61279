"""Exactly-once into Delta and Iceberg tables under SIGKILL, on both launchers.

The job (``lake_job.py``) writes numbers into a real Delta table, or a real
Iceberg table (SQL catalog on SQLite, warehouse folder), on local disk,
appended or merged by key. Kills strike at random moments from outside
and at named protocol points: after the snapshot before the commit
(``acked``, ``commit``), during the commit (``table_commit``: the files are
in the table folder or the changes read, the table commit not made) and
after the commit before the task noted it (``table_committed``). The table
must then hold exactly the expected rows, and no checkpoint may be committed
twice (the application transactions in the Delta log; the snapshot summaries
of Iceberg).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.fault.checks import drive

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

HERE = Path(__file__).parent
SOAK = os.environ.get("LOCKGATE_SOAK") == "1"
KEYS = 7
SINKS = ["delta", "iceberg"]


# CI runs the launcher x mode x table combinations pairwise (each pair of
# values of any two of them once); LOCKGATE_SOAK=1 runs all eight
PAIRWISE = {("local", "append", "delta"), ("local", "merge", "iceberg"),
            ("spark", "append", "iceberg"), ("spark", "merge", "delta")}


def full_matrix_only(launcher: str, mode: str, sink: str) -> None:
    if not SOAK and (launcher, mode, sink) not in PAIRWISE:
        pytest.skip("LOCKGATE_SOAK=1: the full matrix")


def run_lake(tmp: Path, *, n: int, mode: str, launcher: str, sink: str = "delta",
             parallelism: int = 2,
             faults: list | None = None, kills: int = 0, seed: int = 0,
             extra: list[str] | None = None) -> tuple[dict, int]:
    cmd = [sys.executable, str(HERE / "lake_job.py"), "--n", str(n), "--parallelism",
           str(parallelism), "--keys", str(KEYS), "--table", str(tmp / "table"),
           "--storage", str(tmp / "chk"), "--mode", mode, "--interval", "0.2", "--sink", sink,
           "--faults", json.dumps(faults or []), "--launcher", launcher] + (extra or [])
    return drive(cmd, kills=kills, tasks=parallelism * (1 if mode == "append" else 2),
                 seed=seed, kill_delays=(0.2, 0.8), timeout=300)


def delta_commits(table: Path) -> list[tuple[str, int]]:
    """The (app id, version) of every application transaction in the log."""
    txns = []
    for log in sorted((table / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                txns.append((action["txn"]["appId"], int(action["txn"]["version"])))
    return txns


def iceberg_table(tmp: Path):
    from pyiceberg.catalog import load_catalog

    from tests.fault.lake_job import iceberg_catalog
    return load_catalog("lockgate", **iceberg_catalog(str(tmp / "table"))).load_table("lake.t")


def iceberg_commits(tmp: Path) -> list[tuple[str, int]]:
    """The (app id, checkpoint id) of every table commit (one commit may make
    several snapshots, which share its ``lockgate.commit`` nonce)."""
    commits: dict[str, tuple[str, int]] = {}
    for snap in iceberg_table(tmp).metadata.snapshots:
        props = snap.summary.additional_properties
        for key, value in props.items():
            if key.startswith("lockgate.checkpoint."):
                commits[props["lockgate.commit"]] = (key[len("lockgate.checkpoint."):],
                                                     int(value))
    return list(commits.values())


def check_table(tmp: Path, n: int, mode: str, sink: str = "delta",
                partitioned: bool = False) -> None:
    """The table holds exactly the expected rows; no checkpoint twice."""
    table = tmp / "table"
    if sink == "delta":
        rows = deltalake.DeltaTable(str(table)).to_pyarrow_table().to_pylist()
        txns = delta_commits(table)
        staging = table / "_lockgate"
    else:
        rows = iceberg_table(tmp).scan().to_arrow().to_pylist()
        txns = iceberg_commits(tmp)
        staging = table / "warehouse" / "_lockgate"
    if partitioned:
        assert all(r["band"] == r["k"] % 3 for r in rows)
        check_partition_folders(tmp, sink)
    if mode == "append":
        got = sorted((r["id"], r["k"]) for r in rows)
        assert got == [(x, x % KEYS) for x in range(1, n + 1)], (len(got), n)
    else:
        want = {k: (sum(range(k or KEYS, n + 1, KEYS)), len(range(k or KEYS, n + 1, KEYS)))
                for k in range(KEYS)}
        assert {r["k"]: (r["total"], r["n"]) for r in rows} == want
    assert len(txns) == len(set(txns)), f"a checkpoint was committed twice: {txns}"
    for app in {a for a, _ in txns}:
        versions = [v for a, v in txns if a == app]
        assert versions == sorted(versions), versions
    staged = [p for p in staging.rglob("*") if p.is_file() and ".lockgate-probe" not in p.name]
    assert not staged, f"staged files left behind: {staged}"


def check_partition_folders(tmp: Path, sink: str) -> None:
    """Every data file of the table lies in its ``band=<b>/`` folder, and the
    table says it is partitioned by ``band``."""
    if sink == "delta":
        table = deltalake.DeltaTable(str(tmp / "table"))
        assert table.metadata().partition_columns == ["band"]
        files = table.file_uris()
    else:
        table = iceberg_table(tmp)
        assert [f.name for f in table.spec().fields] == ["band"]
        files = [t.file.file_path for t in table.scan().plan_files()]
    assert files
    for f in files:
        assert Path(f).parent.name in {"band=0", "band=1", "band=2"}, f


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("mode", ["append", "merge"])
def test_partitioned_table_under_kills(tmp_path, sink, mode, launcher):
    """A table partitioned by a column (Hive-style folders for Delta, an
    identity partition spec for Iceberg): kills before the ack, in the middle
    of the table commit and after it; every row once, each in its partition."""
    full_matrix_only(launcher, mode, sink)
    n = 3000
    sink0 = 0 if mode == "append" else 2  # the committer's global task number
    faults = [
        {"point": "snapshot", "task": sink0 + 1, "attempt": 0, "count": 1},
        {"point": "table_commit", "task": sink0, "attempt": 1, "count": 1},
        {"point": "table_committed", "task": sink0, "attempt": 2, "count": 1},
    ]
    result, _ = run_lake(tmp_path, n=n, mode=mode, launcher=launcher, faults=faults, sink=sink,
                         extra=["--rate", "2000", "--partitioned"])
    check_table(tmp_path, n, mode, sink, partitioned=True)
    assert result["status"] == "finished"
    assert result["restarts"] == 3, result["failures"]


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("mode", ["append", "merge"])
def test_kills_at_protocol_points(tmp_path, sink, mode, launcher):
    """One kill per attempt at each named point of the commit protocol."""
    full_matrix_only(launcher, mode, sink)
    n = 4000
    sink0 = 0 if mode == "append" else 2  # the committer's global task number
    faults = [
        {"point": "snapshot", "task": sink0 + 1, "attempt": 0, "count": 1},
        {"point": "acked", "task": sink0, "attempt": 1, "count": 1},
        {"point": "commit", "task": sink0, "attempt": 2, "count": 1},
        {"point": "table_commit", "task": sink0, "attempt": 3, "count": 1},
    ]
    result, _ = run_lake(tmp_path, n=n, mode=mode, launcher=launcher, faults=faults, sink=sink,
                         extra=["--rate", "2000"])
    check_table(tmp_path, n, mode, sink)
    assert result["status"] == "finished"
    assert result["restarts"] == 4, result["failures"]


@pytest.mark.parametrize("sink", SINKS)
def test_kill_after_commit_before_notify(tmp_path, sink, launcher):
    """The table commit is made, the committer dies before it notes it: the
    restore finds the checkpoint in the table and does not commit it again."""
    n = 3000
    faults = [{"point": "table_committed", "task": 0, "attempt": 0, "count": 1}]
    result, _ = run_lake(tmp_path, n=n, mode="append", launcher=launcher, sink=sink,
                         faults=faults, extra=["--rate", "4000"])
    check_table(tmp_path, n, "append", sink)
    assert result["restarts"] == 1, result["failures"]


# CI runs one mode per format; LOCKGATE_SOAK=1 runs all four, longer
RANDOM = ([(s, m) for s in SINKS for m in ("append", "merge")] if SOAK
          else [("delta", "merge"), ("iceberg", "append")])


@pytest.mark.parametrize("sink,mode", RANDOM)
def test_random_kills(tmp_path, sink, mode, launcher):
    """SIGKILL random tasks at random moments, from outside."""
    kills = 8 if SOAK else 3
    n = 40_000 if SOAK else 12_000
    result, done = run_lake(tmp_path, n=n, mode=mode, launcher=launcher, kills=kills, seed=5,
                            sink=sink, extra=["--rate", "5000"])
    check_table(tmp_path, n, mode, sink)
    assert done == kills, f"only {done} kills happened"
    assert result["restarts"] >= kills - 1


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("mode", ["append", "merge"])
def test_restore_from_savepoint_commits_once(tmp_path, sink, mode, launcher):
    """Stop with a savepoint (its pending files are committed), restore it at
    another parallelism and run to the end: the savepoint's checkpoint is in
    the table once and every row exactly once."""
    full_matrix_only(launcher, mode, sink)
    import argparse

    from tests.fault.lake_job import build
    from tests.fixtures import start_and_await

    n = 6000

    def job(parallelism: int, rate: float | None) -> object:
        return build(argparse.Namespace(
            n=n, parallelism=parallelism, keys=KEYS, table=str(tmp_path / "table"),
            storage=str(tmp_path / "chk"), mode=mode, interval=0.2, rate=rate, sink=sink))

    client = start_and_await(job(2, 3000), launcher=launcher)
    stopped = client.stop(dir=str(tmp_path / "savepoints"))
    assert stopped.status == "stopped" and stopped.savepoint is not None
    commits = (lambda: delta_commits(tmp_path / "table")) if sink == "delta" \
        else (lambda: iceberg_commits(tmp_path))
    first = commits()
    assert first, "the savepoint committed nothing"
    final = job(3, None).run(launcher=launcher, from_savepoint=stopped.savepoint)
    assert final.status == "finished"
    check_table(tmp_path, n, mode, sink)
    assert commits()[:len(first)] == first
