"""Classes defined in the job script itself: records of them cross channels
between tasks, and ``allow_pickle`` state of them is snapshotted and
restored after a kill, on both launchers and under ``lockgate run`` (a
task's ``__main__`` is not the script)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.fixtures import check_exact_sums, check_running_sums, committed_lines

APP = '''
import sys
from dataclasses import dataclass

from lockgate import (CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline,
                      ValueStateDescriptor)
from lockgate.connectors import FileSink, SequenceSource


@dataclass
class Reading:
    sensor: int
    value: int


@dataclass
class Total:
    count: int = 0
    total: int = 0


class Totals(KeyedProcessFunction):
    def open(self, ctx):
        self.acc = ctx.get_state(ValueStateDescriptor("acc", default=Total()))

    def process_element(self, r, ctx):
        acc = self.acc.value()
        acc.count += 1
        acc.total += r.value
        self.acc.update(acc)
        yield [r.sensor, acc.total]


def build(n, out, chk):
    p = Pipeline("script-classes", parallelism=2, allow_pickle=True,
                 checkpoint=CheckpointConfig(interval=0.1, storage=chk),
                 restart=FixedDelayRestart(max_attempts=5, delay_s=0.0))
    (p.source(SequenceSource(1, n, rate=20_000), uid="numbers")
       .map(lambda x: Reading(x % 3, x), uid="readings")
       .key_by(lambda r: r.sensor)
       .process(Totals(), uid="totals")
       .sink(FileSink(out, format="jsonl"), uid="out"))
    return p


N = 12_000
pipeline = build(N, "out", "chk")

if __name__ == "__main__":
    # the keyed task is killed once after its third checkpoint: the restore
    # unpickles Total from state
    faults = [{"point": "acked", "task": 2, "attempt": 0, "count": 3}]
    result = pipeline.run(launcher=sys.argv[1], fault_injection=faults)
    print(result.status, result.restarts)
'''


def test_script_classes_in_records_and_state_survive_a_kill(tmp_path: Path, launcher: str):
    (tmp_path / "app.py").write_text(APP)
    run = subprocess.run([sys.executable, "app.py", launcher], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["finished", "1"], run.stdout + run.stderr[-3000:]
    check_exact_sums(tmp_path / "out", 12_000, 3)
    # quiet by default: Lockgate's restart line, none of Spark's log lines (its
    # banner, the stack traces of the Python worker that was killed)
    spark_lines = [line for line in run.stderr.splitlines()
                   if re.match(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d ", line)
                   or "Setting default log level" in line or line.startswith("\tat ")]
    assert spark_lines == [], run.stderr[-3000:]
    assert "attempt 0 failed" in run.stderr


def test_script_classes_under_lockgate_run(tmp_path: Path):
    (tmp_path / "app.py").write_text(APP)
    run = subprocess.run([sys.executable, "-m", "lockgate.cli", "run", "app.py",
                          "--launcher", "local", "-q"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    check_running_sums(committed_lines(tmp_path / "out"), 12_000, 3)
