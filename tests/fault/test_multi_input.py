"""Several inputs exactly-once under SIGKILL and through a rescale:
one pipeline with broadcast state (rule versions
broadcast to a keyed enrichment), a side output (rejected numbers), windows
(tumbling sums) and an interval join (each number with its window's sum),
``tests/fault/enrich_job.py``. The committed output and side output equal
the plain-Python reference record by record.

CI: three random kills on the local launcher, two on Spark, and one rescale
2 -> 3 through a savepoint; ``LOCKGATE_SOAK=1``: more kills over a longer input, and a
rescale 3 -> 1 -> 2."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.fault.checks import HERE, drive
from tests.fault.enrich_job import build, reference
from tests.fixtures import committed_lines, hidden_files, start_and_await

SOAK = bool(os.environ.get("LOCKGATE_SOAK"))


def check(tmp: Path, n: int) -> None:
    out, rejected = reference(n)
    got = Counter(tuple(r) for r in committed_lines(tmp / "out"))
    assert got == out, (f"{sum(got.values())} records committed, {sum(out.values())} expected; "
                        f"missing {sum((out - got).values())}, extra {sum((got - out).values())}")
    assert sorted(committed_lines(tmp / "rejected")) == rejected
    assert hidden_files(tmp / "out") == [] and hidden_files(tmp / "rejected") == []


def test_enrichment_join_and_windows_are_exact_under_random_kills(tmp_path, launcher):
    n, p = (60_000, 2) if SOAK else (20_000, 2)
    kills = 8 if SOAK else (3 if launcher == "local" else 2)  # a Spark restart costs more
    cmd = [sys.executable, str(HERE / "enrich_job.py"), "--n", str(n), "--parallelism", str(p),
           "--out", str(tmp_path / "out"), "--rejected", str(tmp_path / "rejected"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", "5000",
           "--launcher", launcher]
    # tasks: numbers, rules, enrich x p, sums x p, share+sink x p, rejected sink
    result, done = drive(cmd, kills=kills, tasks=3 + 3 * p, seed=23, kill_delays=(0.3, 1.0),
                         timeout=600 if SOAK else 300)
    assert result["status"] == "finished"
    assert done == kills and result["restarts"] >= kills - 1, result["failures"]
    check(tmp_path, n)


@pytest.mark.parametrize("steps", [(2, 3)] + ([(3, 1, 2)] if SOAK else []))
def test_enrichment_join_and_windows_rescale_through_savepoints(tmp_path, steps):
    """Stopped with a savepoint and resumed at another parallelism: keyed
    state, timers, the operators' watermarks and the broadcast state (each
    new task takes an old task's copy) move; the output stays exact."""
    n = 24_000

    def job(parallelism: int, held: bool = True):
        # held: a hop's input cannot end before its stop, however slow the machine
        return build(n, parallelism, str(tmp_path / "out"), str(tmp_path / "rejected"),
                     str(tmp_path / "chk"), interval=0.2, rate=6000, held=held)

    savepoint = None
    for i, parallelism in enumerate(steps[:-1]):
        client = start_and_await(job(parallelism), launcher="local",
                                 until=lambda pr, i=i: pr.records_read > n * (i + 1) // len(steps),
                                 from_savepoint=savepoint)
        stopped = client.stop(str(tmp_path / f"sp{i}"))
        assert stopped.status == "stopped" and stopped.savepoint
        savepoint = stopped.savepoint
    last = job(steps[-1], held=False).run(launcher="local", from_savepoint=savepoint)
    assert last.status == "finished"
    check(tmp_path, n)
