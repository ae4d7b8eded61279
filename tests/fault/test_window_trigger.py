"""A custom trigger exactly-once under SIGKILL: the windowed-sums job
(``windows_job.py``) with ``CountTrigger.of(7)`` on its tumbling event-time
windows fires every 7th record a window takes with the window's running
sum; the trigger's counts are keyed state and its windows go at ``end - 1 +
allowed lateness``. The committed firings and late records equal a
plain-Python reference record by record. On the local launcher in CI, on
Spark with ``LOCKGATE_SOAK=1``."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests import window_reference as ref
from tests.fault.checks import HERE, drive
from tests.fixtures import committed_lines, hidden_files

KEYS = 3
EVERY = 7
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))


def reference(n: int) -> tuple[Counter, list[int]]:
    """Every ``EVERY``-th record a window takes fires ``[key, start, running
    sum]``. A tumbling window takes every record that is not late (a record
    whose window is late is late itself), in the order of ``x`` per key."""
    _, late = ref.job_reference(n, KEYS, ref.tumbling(ref.SIZE))
    dropped = set(late)
    counts: Counter = Counter()
    sums: Counter = Counter()
    fired: Counter = Counter()
    for x in range(1, n + 1):
        if x in dropped:
            continue
        (w,) = ref.tumbling(ref.SIZE)(ref.timestamp(x))
        counts[x % KEYS, w] += 1
        sums[x % KEYS, w] += x
        if counts[x % KEYS, w] % EVERY == 0:
            fired[x % KEYS, w[0], sums[x % KEYS, w]] += 1
    return fired, late


@pytest.mark.parametrize("launcher", [
    "local", pytest.param("spark", marks=pytest.mark.skipif(
        not SOAK, reason="LOCKGATE_SOAK=1: on Spark too"))])
def test_a_custom_trigger_is_exact_under_random_kills(tmp_path: Path, launcher: str) -> None:
    n, p = (16_000 if launcher == "local" else 30_000), 2  # Spark: its restarts are slower
    cmd = [sys.executable, str(HERE / "windows_job.py"), "--n", str(n), "--parallelism", str(p),
           "--keys", str(KEYS), "--out", str(tmp_path / "out"), "--late", str(tmp_path / "late"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", "6000",
           "--launcher", launcher, "--trigger", str(EVERY)]
    result, kills = drive(cmd, kills=3, tasks=1 + 3 * p, seed=17, kill_delays=(0.3, 0.8),
                          timeout=240)
    assert result["status"] == "finished"
    assert kills == 3 and result["restarts"] >= kills - 1, result["failures"]
    fired, late = reference(n)
    got = Counter(tuple(r) for r in committed_lines(tmp_path / "out"))
    assert got == fired and sum(fired.values()) > 1_000
    assert sorted(committed_lines(tmp_path / "late")) == sorted(late) and late
    assert hidden_files(tmp_path / "out") == [] and hidden_files(tmp_path / "late") == []
