"""The examples in examples/ run as documented."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.connectors.mysql_server import mysql_binlog  # noqa: F401
from tests.connectors.postgres_server import postgres_logical  # noqa: F401
from tests.fixtures import committed_lines

EXAMPLES = Path(__file__).parents[2] / "examples"
WAYS = ["python", "lockgate run", "spark-submit"]


def run_example(way: str, script: str, args: list[str], cwd: Path):
    """Run ``examples/<script>`` as a user would, one of three ways: ``python``
    (the local Spark session it starts), ``lockgate run`` (the local launcher),
    or ``spark-submit`` (its own master)."""
    path = str(EXAMPLES / script)
    env = dict(os.environ)
    if way == "python":
        cmd = [sys.executable, path, *args]
    elif way == "lockgate run":
        cmd = [sys.executable, "-m", "lockgate.cli", "run", path, "--launcher", "local", "-q",
               *args]
    else:
        import pyspark

        from lockgate.cluster.spark.java import ensure_java

        ensure_java()
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   JAVA_HOME=os.environ.get("JAVA_HOME", env.get("JAVA_HOME", "")))
        submit = Path(os.path.dirname(pyspark.__file__)) / "bin" / "spark-submit"
        cmd = [str(submit), "--master", "local[4]", "--conf", "spark.ui.enabled=false",
               path, *args]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{way}: {out.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("way", WAYS)
def test_sums_by_remainder(tmp_path, way):
    out = run_example(way, "sums_by_remainder.py", ["20000"], tmp_path)
    if way == "lockgate run":
        assert "20000 records in, 20000 out" in out.stdout
    else:
        assert "20000 running sums committed" in out.stdout and "exactly_once" in out.stdout
    final: dict[int, list[int]] = {}
    writers = set()
    for f in sorted((tmp_path / "out").glob("part-*")):
        writers.add(f.name.split("-")[2])  # part-<uid>-<task>-...
        for line in f.read_text().splitlines():
            k, count, total = json.loads(line)
            if count > final.get(k, [0, 0])[0]:
                final[k] = [count, total]
    assert final == {k: [200, sum(range(k or 100, 20001, 100))] for k in range(100)}
    assert writers == {"0", "1"}, "the quickstart's parallelism is not visible"


@pytest.mark.parametrize("way", WAYS)
def test_word_count_state(tmp_path, way):
    src = tmp_path / "in"
    src.mkdir()
    texts = ["a b a", "c a", "b b"]
    (src / "lines.jsonl").write_text(
        "".join(json.dumps({"n": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    run_example(way, "word_count_state.py", [str(src), str(tmp_path / "out")], tmp_path)
    rows = pq.read_table(tmp_path / "out").to_pylist()
    best: dict[str, int] = {}
    for r in rows:
        best[r["word"]] = max(best.get(r["word"], 0), r["count"])
    assert best == {"a": 3, "b": 3, "c": 1, "<end>": 0}
    assert sum(1 for r in rows if r["word"] == "<end>") == 2  # finish() once per task


@pytest.mark.parametrize("way", WAYS)
def test_event_time_windows(tmp_path, way):
    """Clicks up to 5 s out of order (within the 10 s bound): every window is
    emitted once, with the count computed here, and nothing is late."""
    rng = random.Random(3)
    src = tmp_path / "in"
    src.mkdir()
    clicks = [{"user": rng.choice("abc"), "ts": 1_700_000_000_000 + i * 250} for i in range(2_000)]
    for c in clicks:
        c["ts"] -= rng.randint(0, 5_000)  # out of order, within the bound
    (src / "clicks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in clicks))
    run_example(way, "event_time_windows.py", [str(src), str(tmp_path / "out")], tmp_path)
    rows = committed_lines(tmp_path / "out")
    assert not [r for r in rows if "late" in r]
    got = Counter()
    for r in rows:
        assert (r["user"], r["window_start"]) not in got, "a window was emitted twice"
        got[(r["user"], r["window_start"])] = r["clicks"]
    assert got == Counter((c["user"], c["ts"] - c["ts"] % 60_000) for c in clicks)


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_windowed_counts(tmp_path, way):
    """Clicks out of order, some of them very late: each window's last count
    and its late clicks together are every click of the window, once."""
    rng = random.Random(4)
    src = tmp_path / "in"
    src.mkdir()
    clicks = [{"user": rng.choice("abc"), "ts": 1_700_000_000_000 + i * 100}
              for i in range(6_000)]
    for i, c in enumerate(clicks):
        c["ts"] -= rng.randint(0, 5_000) if i % 50 else 180_000  # some 3 minutes late
    (src / "clicks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in clicks))
    run_example(way, "windowed_counts.py", [str(src), str(tmp_path / "out")], tmp_path)
    last: dict[tuple[str, int], int] = {}
    for r in committed_lines(tmp_path / "out" / "counts"):
        window = (r["user"], r["window_start"])
        last[window] = max(last.get(window, 0), r["clicks"])
    late = Counter((c["user"], c["ts"] - c["ts"] % 60_000)
                   for c in committed_lines(tmp_path / "out" / "late"))
    assert Counter(last) + late == Counter((c["user"], c["ts"] - c["ts"] % 60_000)
                                           for c in clicks)


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_socket_word_count(tmp_path, way):
    """A source that cannot replay: the job runs because it names it, and
    says at-most-once."""
    from lockgate.connectors import CollectSink

    args = ["--allow-non-replayable", "lines"] if way == "lockgate run" else []
    out = run_example(way, "socket_word_count.py", args, tmp_path)
    assert "at_most_once" in out.stdout, out.stdout
    assert "AT-MOST-ONCE" in out.stderr, out.stderr[-2000:]
    counts: dict[str, int] = {}
    for word, n in CollectSink(str(tmp_path / "counts")).results():
        counts[word] = max(n, counts.get(word, 0))
    assert counts == {"the": 3, "lock": 2, "holds": 1, "water": 1, "until": 1, "both": 1,
                      "levels": 1, "are": 1, "aligned": 1, "then": 1, "one": 1, "batch": 1,
                      "goes": 1, "through": 1}


MULTI_INPUT_WAYS = ["lockgate run"] + (["python"] if os.environ.get("LOCKGATE_SOAK") else [])
"""The multi-input examples: ``python`` (a Spark session, ~30-60 s each on a
loaded machine) in long runs only."""


def _jsonl(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir()
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("way", MULTI_INPUT_WAYS)
def test_enrich_with_rules(tmp_path, way):
    """Each payment checked against the limit of its category in force at its
    time, whatever order the two streams' records interleave in."""
    rng = random.Random(5)
    t0 = 1_700_000_000_000
    limits = [{"ts": t0 + 10_000 * v, "category": c, "limit": rng.randint(20, 80)}
              for v in range(30) for c in ("food", "travel")]
    payments = [{"id": i, "account": rng.choice("abcdef"), "category":
                 rng.choice(["food", "travel"]), "ts": t0 + i * 60 - rng.randint(0, 4_000),
                 "amount": rng.randint(1, 100)} for i in range(5_000)]
    _jsonl(tmp_path / "payments", "p.jsonl", payments)
    _jsonl(tmp_path / "limits", "l.jsonl", limits)
    run_example(way, "enrich_with_rules.py",
                [str(tmp_path / "payments"), str(tmp_path / "limits"), str(tmp_path / "out")],
                tmp_path)
    checked, alerts, unchecked = [], [], []
    for pay in payments:
        history = [lim["limit"] for lim in limits
                   if lim["category"] == pay["category"] and lim["ts"] <= pay["ts"]]
        if not history:
            unchecked.append(pay)
            continue
        row = dict(pay, limit=history[-1])
        checked.append(row)
        if pay["amount"] > row["limit"]:
            alerts.append(row)

    def key(rows: list[dict]) -> list[str]:
        return sorted(json.dumps(r, sort_keys=True) for r in rows)

    assert alerts and unchecked
    assert key(committed_lines(tmp_path / "out" / "checked")) == key(checked)
    assert key(committed_lines(tmp_path / "out" / "alerts")) == key(alerts)
    assert key(committed_lines(tmp_path / "out" / "unchecked")) == key(unchecked)


@pytest.mark.parametrize("way", MULTI_INPUT_WAYS)
def test_orders_payments_join(tmp_path, way):
    """The interval join pairs each payment made within 10 minutes after its
    order; the window join each order with its payments of the same hour."""
    rng = random.Random(6)
    t0 = 1_700_000_000_000
    orders = [{"order": i, "customer": rng.choice("xyz"), "ts": t0 + i * 1_000
               - rng.randint(0, 4_000), "total": rng.randint(5, 500)} for i in range(3_000)]
    payments = [{"order": o["order"], "ts": o["ts"] + rng.choice([-1, 1, 2]) * rng.randint(
                 0, 900_000), "amount": rng.randint(1, 500)}
                for o in orders for _ in range(rng.randint(0, 2))]
    payments.sort(key=lambda pay: pay["ts"])
    for i in range(0, len(payments) - 1, 7):  # a little out of order
        payments[i], payments[i + 1] = payments[i + 1], payments[i]
    _jsonl(tmp_path / "orders", "o.jsonl", orders)
    _jsonl(tmp_path / "payments", "p.jsonl", payments)
    run_example(way, "orders_payments_join.py",
                [str(tmp_path / "orders"), str(tmp_path / "payments"), str(tmp_path / "out")],
                tmp_path)
    by_order = {o["order"]: o for o in orders}
    hour = 3_600_000
    paid = Counter((pay["order"], pay["amount"], pay["ts"] - by_order[pay["order"]]["ts"])
                   for pay in payments
                   if 0 <= pay["ts"] - by_order[pay["order"]]["ts"] <= 600_000)
    hourly = Counter((pay["order"], by_order[pay["order"]]["ts"] // hour, pay["amount"])
                     for pay in payments
                     if pay["ts"] // hour == by_order[pay["order"]]["ts"] // hour)
    assert paid and hourly
    assert Counter((r["order"], r["amount"], r["delay_ms"])
                   for r in committed_lines(tmp_path / "out" / "paid")) == paid
    assert Counter((r["order"], r["hour"], r["amount"])
                   for r in committed_lines(tmp_path / "out" / "hourly")) == hourly


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_delta_orders(tmp_path, way):
    deltalake = pytest.importorskip("deltalake")
    run_example(way, "delta_orders.py", ["20000"], tmp_path)
    orders = deltalake.DeltaTable(str(tmp_path / "lake" / "orders")).to_pyarrow_table()
    assert sorted(orders.column("order").to_pylist()) == list(range(1, 20001))
    totals = deltalake.DeltaTable(str(tmp_path / "lake" / "totals")).to_pyarrow_table()
    got = {r["user"]: (r["orders"], r["total"]) for r in totals.to_pylist()}
    want = {u: (200, sum(o / 100 for o in range(u or 100, 20001, 100))) for u in range(100)}
    assert got.keys() == want.keys()
    for u, (count, total) in want.items():
        assert got[u][0] == count and got[u][1] == pytest.approx(total), u


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_iceberg_orders(tmp_path, way):
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog import load_catalog

    run_example(way, "iceberg_orders.py", ["20000"], tmp_path)
    lake = tmp_path / "lake"
    tables = load_catalog("lockgate", type="sql", uri=f"sqlite:///{lake}/catalog.db",
                          warehouse=f"file://{lake}/warehouse")
    orders = tables.load_table("shop.orders").scan().to_arrow()
    assert sorted(orders.column("order").to_pylist()) == list(range(1, 20001))
    totals = tables.load_table("shop.totals").scan().to_arrow()
    got = {r["user"]: (r["orders"], r["total"]) for r in totals.to_pylist()}
    want = {u: (200, sum(o / 100 for o in range(u or 100, 20001, 100))) for u in range(100)}
    assert got.keys() == want.keys()
    for u, (count, total) in want.items():
        assert got[u][0] == count and got[u][1] == pytest.approx(total), u


def _mirrored(changes: Path) -> dict[int, dict]:
    """The rows by id after applying the committed change events, each
    version of a row (the writer's update counts them) and each delete once."""
    rows: dict[int, dict] = {}
    versions: dict[int, list[int]] = {}
    deleted: list[int] = []
    for e in committed_lines(changes):
        if e["op"] == "delete":
            deleted.append(e["before"]["id"])
            continue
        row = e["after"]
        versions.setdefault(row["id"], []).append(row["version"])
        if row["version"] == max(versions[row["id"]]):
            rows[row["id"]] = row
    assert all(sorted(v) == list(range(min(v), max(v) + 1)) for v in versions.values())
    assert len(deleted) == len(set(deleted))
    for i in deleted:
        rows.pop(i, None)
    return rows


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_postgres_cdc(tmp_path, way, postgres_logical, monkeypatch):  # noqa: F811
    """The snapshot and the writer's changes, once each: applying the events
    by id gives the table."""
    import psycopg

    monkeypatch.setenv("POSTGRES_CDC_DSN", postgres_logical)
    out = run_example(way, "postgres_cdc.py", ["3000"], tmp_path)
    assert "change events written" in out.stdout or "finished" in out.stdout, out.stdout
    rows = _mirrored(tmp_path / "out" / "changes")
    with psycopg.connect(postgres_logical) as conn:
        table = {r[0]: {"id": r[0], "status": r[1], "version": r[2]}
                 for r in conn.execute("SELECT id, status, version FROM cdc_orders")}
    assert rows == table


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_mysql_cdc(tmp_path, way, mysql_binlog, monkeypatch):  # noqa: F811
    """The snapshot and the writer's changes, once each: applying the events
    by id gives the table."""
    from tests.connectors.mysql_server import query

    monkeypatch.setenv("MYSQL_CDC_DSN", mysql_binlog)
    out = run_example(way, "mysql_cdc.py", ["3000"], tmp_path)
    assert "change events written" in out.stdout or "finished" in out.stdout, out.stdout
    rows = _mirrored(tmp_path / "out" / "changes")
    table = {r[0]: {"id": r[0], "status": r[1], "version": r[2]}
             for r in query(mysql_binlog, "SELECT id, status, version FROM cdc_example.orders")}
    assert rows == table


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_cdc_to_lakehouse(tmp_path, way, postgres_logical, monkeypatch):  # noqa: F811
    """The flagship: the Delta table and the Iceberg table equal the
    PostgreSQL table row for row after the writer's inserts, updates, region
    moves and deletes; each checkpoint is committed once to each table."""
    import psycopg
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    from tests.fault.test_lakehouse import delta_commits

    monkeypatch.setenv("POSTGRES_CDC_DSN", postgres_logical)
    out = run_example(way, "cdc_to_lakehouse.py", ["3000"], tmp_path)
    if way == "python":
        assert out.stdout.count("equal: True") == 2, out.stdout
    columns = ["id", "name", "region", "balance", "version"]
    with psycopg.connect(postgres_logical) as conn:
        want = sorted(conn.execute(f"SELECT {', '.join(columns)} FROM customers"))
        changed = conn.execute("SELECT count(*) FROM customers WHERE version > 0").fetchone()
    assert len(want) > 2000 and changed[0] > 100
    lake = tmp_path / "lake"
    delta = DeltaTable(str(lake / "customers"))
    catalog = load_catalog("lockgate", type="sql", uri=f"sqlite:///{lake}/catalog.db",
                           warehouse=f"file://{lake}/warehouse")
    iceberg = catalog.load_table("crm.customers")
    for table in (delta.to_pyarrow_table(), iceberg.scan().to_arrow()):
        assert sorted(tuple(r[c] for c in columns) for r in table.to_pylist()) == want
    assert delta.metadata().partition_columns == ["region"]
    assert [f.name for f in iceberg.spec().fields] == ["region"]
    txns = delta_commits(lake / "customers")
    assert txns and len(txns) == len(set(txns))
