"""Windows exactly-once under SIGKILL and through a rescale: a tumbling
event-time sum per key and window, late records (beyond the allowed
lateness) to a side output; the committed windows, late firings included,
and the committed late records equal the plain-Python reference record by
record (``tests/window_reference.py``)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from tests import window_reference as ref
from tests.fault.checks import HERE, drive
from tests.fault.windows_job import BOUND, GAP, SLIDE, build
from tests.fixtures import committed_lines, hidden_files, start_and_await

KEYS = 3


def check(tmp: Path, n: int, windows: str = "tumbling", keys: int = KEYS,
          stamps: str = "default") -> None:
    """The committed windows (or join pairs) and late records of
    ``windows_job.py --windows windows --stamps stamps`` equal the
    reference, record by record."""
    stamp = ref.STAMPS[stamps]
    got = Counter(tuple(r) for r in committed_lines(tmp / "out"))
    assert hidden_files(tmp / "out") == [] and hidden_files(tmp / "late") == []
    if windows == "join":
        pairs, late = ref.join_reference(n, keys, BOUND, stamp)
        assert got == Counter(pairs), (f"missing {sum((Counter(pairs) - got).values())}, "
                                       f"extra {sum((got - Counter(pairs)).values())}")
        assert sorted(committed_lines(tmp / "late")) == sorted(late)
        return
    assign = {"tumbling": ref.tumbling(ref.SIZE), "sliding": ref.sliding(ref.SIZE, SLIDE),
              "session": ref.session(GAP)}[windows]
    fired, late = ref.job_reference(n, keys, assign, merging=windows == "session", stamp=stamp)
    if windows == "tumbling":
        assert got == Counter((k, start, total) for k, start, _, total in fired)
    else:
        assert got == Counter(fired)
    assert sorted(committed_lines(tmp / "late")) == sorted(late)


def test_windows_are_exact_under_random_kills(tmp_path, launcher):
    n, p = 24_000, 2
    cmd = [sys.executable, str(HERE / "windows_job.py"), "--n", str(n), "--parallelism", str(p),
           "--keys", str(KEYS), "--out", str(tmp_path / "out"), "--late", str(tmp_path / "late"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", "6000",
           "--launcher", launcher]
    result, kills = drive(cmd, kills=3, tasks=1 + 3 * p, seed=11, kill_delays=(0.3, 1.0),
                          timeout=240)
    assert result["status"] == "finished"
    assert kills == 3 and result["restarts"] >= kills - 1, result["failures"]
    check(tmp_path, n)


def test_windows_rescale_through_a_savepoint(tmp_path):
    """Stopped with a savepoint at parallelism 2, resumed at 3: windows,
    their timers and the watermark move by key group."""
    n = 24_000

    def job(parallelism: int):
        return build(n, parallelism, KEYS, str(tmp_path / "out"), str(tmp_path / "late"),
                     str(tmp_path / "chk"), interval=0.2, rate=8000)

    first = start_and_await(job(2), launcher="local",
                            until=lambda pr: pr.records_read > n // 3).stop(str(tmp_path / "sp"))
    assert first.status == "stopped" and first.savepoint
    second = job(3).run(launcher="local", from_savepoint=first.savepoint)
    assert second.status == "finished"
    check(tmp_path, n)
