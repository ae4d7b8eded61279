"""JetStream -> running sums -> PostgresSink (two-phase commit) under
SIGKILLs, on both launchers: killed between pre-commit and commit
(``acked``), after the completion notice (``commit``) and at random
moments, the table holds exactly the running sums of the stream's records
and ``pg_prepared_xacts`` nothing of the job. Needs the NATS server
(``LOCKGATE_TEST_NATS``) and a PostgreSQL that prepares transactions
(``postgres_2pc``: a throwaway cluster, or ``LOCKGATE_TEST_POSTGRES_2PC``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.connectors.nats_server import make_stream, publish, unique
from tests.connectors.test_postgres import check_table, new_table
from tests.fault.checks import drive

JOB = Path(__file__).parent / "nats_sums_job.py"


def test_jetstream_to_postgres_under_kills(tmp_path, nats_url, postgres_2pc, launcher):
    n, keys = 8000, 5
    name = unique(f"pg_{launcher}")
    make_stream(nats_url, name, [f"{name}.in.>"])
    publish(nats_url, [(f"{name}.in.{x % 2}", str(x).encode()) for x in range(1, n + 1)])
    table = new_table(postgres_2pc)
    faults = [{"point": "acked", "task": 2, "attempt": 0, "count": 2},
              {"point": "commit", "task": 3, "attempt": 1, "count": 2}]
    cmd = [sys.executable, str(JOB), "--url", nats_url, "--stream", name,
           "--subjects", f"{name}.in.0,{name}.in.1", "--dsn", postgres_2pc, "--table", table,
           "--storage", str(tmp_path / "chk"), "--parallelism", "2", "--keys", str(keys),
           "--interval", "0.2", "--pause", "0.0004", "--faults", json.dumps(faults),
           "--launcher", launcher]
    result, kills = drive(cmd, kills=2, tasks=4, seed=11, kill_delays=(0.3, 1.0), timeout=240)
    assert kills == 2, f"only {kills} random kills happened"
    assert result["status"] == "finished" and result["guarantee"] == "exactly_once", result
    assert result["restarts"] >= len(faults), result["failures"]
    check_table(postgres_2pc, table, n, keys)
