"""The W2 mode of ``benchmarks/bench_rescale.py`` runs end to end: a few
thousand keys on RocksDB, local launcher, one rescale up and one down. No
figure is checked (a benchmark on a shared machine), only that the mode
works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_w2_mode_rescales_up_and_down(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rescale.py"), "--workload", "w2",
         "--keys", "3000", "--rounds", "1", "--launcher", "local",
         "--savepoint-cache", str(tmp_path / "savepoints")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "2 -> 3: pause" in done.stdout and "3 -> 2: pause" in done.stdout, done.stdout
    assert (tmp_path / "savepoints" / "keys-3000" / "_metadata").exists()
