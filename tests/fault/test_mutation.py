"""Exactly-once for ordinary Python that mutates state in place, under SIGKILL.

The job (``mutation_job.py``) computes running sums per key four ways, each
by code that mutates the object it got from state (value, list and map state)
or its reduce accumulator, and emits that very object. Random SIGKILLs from
outside, on both launchers; every branch's committed output is compared with
the expected running sums, record by record. Before state had value semantics
these failed even without a kill: a record emitted and then changed by the
next record of its key, a mutable default shared by every key, and snapshots
that a later record changed while they were being written.
"""

from __future__ import annotations

import sys

from tests.fault.checks import HERE, drive
from tests.fault.mutation_job import BRANCHES
from tests.fixtures import check_running_sums, committed_lines, hidden_files


def run(tmp_path, *, n, parallelism, keys, kills, seed, rate=None, launcher):
    out, chk = tmp_path / "out", tmp_path / "chk"
    cmd = [sys.executable, str(HERE / "mutation_job.py"), "--n", str(n), "--parallelism",
           str(parallelism), "--keys", str(keys), "--out", str(out), "--storage", str(chk),
           "--interval", "0.2", "--launcher", launcher] + (["--rate", str(rate)] if rate else [])
    # tasks: the sources (with "pairs" chained) and one task per branch, each p times
    result, killed = drive(cmd, kills=kills, tasks=parallelism * (1 + len(BRANCHES)), seed=seed,
                           kill_delays=(0.2, 0.8), timeout=300)
    for branch in BRANCHES:
        records = committed_lines(out / branch)
        pairs = [r if isinstance(r, list) else [r["k"], r["sum"]] for r in records]
        try:
            check_running_sums(pairs, n, keys)
        except AssertionError as e:
            raise AssertionError(f"branch {branch!r}: {e}") from None
        assert hidden_files(out / branch) == []
    assert result["status"] == "finished"
    return result, killed


def test_in_place_mutation_without_failures_is_exact(tmp_path, launcher):
    # full speed: batches of 1,024 records, many of one key in each
    result, _ = run(tmp_path, n=50_000, parallelism=2, keys=3, kills=0, seed=0,
                    launcher=launcher)
    assert result["restarts"] == 0, result["failures"]


def test_in_place_mutation_under_random_kills_is_exact(tmp_path, launcher):
    # 100,000 records at 25,000/s: at least 4 s of work, while 4 kills at most
    # 0.8 s apart leave at most 3.2 s of progress: every planned kill happens.
    result, kills = run(tmp_path, n=100_000, parallelism=2, keys=7, kills=4, seed=3,
                        rate=25_000, launcher=launcher)
    assert kills == 4, f"only {kills} kills happened"
    assert result["restarts"] >= kills - 1
