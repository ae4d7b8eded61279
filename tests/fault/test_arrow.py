"""The Arrow path exactly-once under SIGKILL, on both launchers: record
batches read from Parquet, routed by key group as Arrow IPC frames,
aggregated into keyed state and written to Parquet by the two-phase file
sink; the committed output is checked record by record
(``arrow_sums_job.check_output``)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.fault.arrow_sums_job import check_output, write_input
from tests.fault.checks import HERE, drive

SOAK = bool(os.environ.get("LOCKGATE_SOAK"))


def _run(tmp_path, launcher: str, *, n: int, kills: int, seed: int, rate: float,
         keys: int = 7, parallelism: int = 2) -> None:
    write_input(tmp_path / "in", n)
    cmd = [sys.executable, str(HERE / "arrow_sums_job.py"), "--input", str(tmp_path / "in"),
           "--parallelism", str(parallelism), "--keys", str(keys),
           "--out", str(tmp_path / "out"), "--copy", str(tmp_path / "copy"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", str(rate),
           "--batch-rows", "1000", "--launcher", launcher]
    # 3 vertices of `parallelism` tasks: source and keys, copy sink, sums and out
    result, done = drive(cmd, kills=kills, tasks=3 * parallelism, seed=seed,
                         kill_delays=(0.1, 0.6), timeout=300)
    assert result["status"] == "finished", result
    assert done == kills, f"only {done} of {kills} kills happened"
    assert result["restarts"] >= kills - 1, result["failures"]
    check_output(tmp_path / "out", tmp_path / "copy", n, keys)


def test_arrow_sums_are_exact_under_random_kills(tmp_path, launcher):
    # 150,000 rows at 40,000/s: at least 3.7 s of reading, while 4 kills at
    # most 0.6 s apart leave at most 2.4 s of progress: every kill happens.
    _run(tmp_path, launcher, n=150_000, kills=4, seed=5, rate=40_000)


@pytest.mark.skipif(not SOAK, reason="long run: LOCKGATE_SOAK=1")
@pytest.mark.parametrize("parallelism,seed", [(2, 21), (3, 22)])
def test_arrow_sums_soak(tmp_path, launcher, parallelism, seed):
    _run(tmp_path, launcher, n=1_200_000, kills=25, seed=seed, rate=100_000,
         keys=101, parallelism=parallelism)
