"""The same app file runs with ``lockgate run`` (the Spark launcher by default)
and with ``spark-submit app.py``; neither prints Spark's log lines nor the
JVM's warning about the incubator module Spark's launcher adds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fixtures import committed_lines

APP = """
import sys
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
pipeline = Pipeline("cli-sums", parallelism=2,
                    checkpoint=CheckpointConfig(interval=0.2, storage="chk"))
(pipeline.source(SequenceSource(1, n, rate=20_000), uid="numbers")
    .key_by(lambda x: x % 3)
    .reduce(lambda a, b: a + b, uid="sums")
    .sink(FileSink("out", format="jsonl"), uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    print(f"RESULT {result.status} {result.records_out}")
"""


def _final_sums(out: Path) -> list[int]:
    return sorted(int(s) for s in committed_lines(out))


def _expected(n: int) -> list[int]:
    # the final running sum of every key: its total
    return sorted(sum(x for x in range(1, n + 1) if x % 3 == k) for k in range(3))


INCUBATOR = "Using incubator modules"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}


def test_lockgate_run_uses_spark_and_prints_progress(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    n = 12_000
    out = subprocess.run(
        [sys.executable, "-m", "lockgate.cli", "run", "app.py:pipeline", "--master", "local[4]",
         str(n)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    progress = [line for line in out.stderr.splitlines() if "] checkpoint " in line]
    assert progress, out.stderr[-3000:]
    assert f"{n:,} records read" in progress[-1]
    assert f"{n} records in, {n} out" in out.stdout and "exactly_once" in out.stdout
    assert INCUBATOR not in out.stderr, out.stderr[-3000:]
    sums = _final_sums(tmp_path / "out")
    assert len(sums) == n and set(_expected(n)) <= set(sums)


def test_a_session_started_through_spark_submit_has_no_incubator_warning(
        tmp_path: Path) -> None:
    """``LOCKGATE_SPARK_LAUNCHER=1``: the driver JVM starts as PySpark starts
    it (``spark-submit``'s scripts and launcher), not from a learned command."""
    (tmp_path / "app.py").write_text(APP)
    env = {**_env(), "LOCKGATE_SPARK_LAUNCHER": "1"}
    out = subprocess.run([sys.executable, "app.py", "3000"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT finished 3000" in out.stdout
    assert INCUBATOR not in out.stderr, out.stderr[-3000:]
    assert " INFO " not in out.stderr and " WARN " not in out.stderr, out.stderr[-3000:]


def test_too_few_slots_from_the_cli(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    out = subprocess.run(
        [sys.executable, "-m", "lockgate.cli", "run", "app.py", "--master", "local[2]"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "needs 4 task slots" in out.stderr and "local[4]" in out.stderr


def test_spark_submit_runs_the_same_app(tmp_path: Path) -> None:
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        submit = Path(shutil.which("spark-submit") or "spark-submit")
    (tmp_path / "app.py").write_text(APP)
    n = 5_000
    env = _env()
    env["PYSPARK_PYTHON"] = sys.executable  # spark-submit would start plain python3
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    out = subprocess.run(
        [str(submit), "--master", "local[4]", "--conf", "spark.ui.enabled=false",
         "app.py", str(n)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"RESULT finished {n}" in out.stdout
    sums = _final_sums(tmp_path / "out")
    assert len(sums) == n and set(_expected(n)) <= set(sums)
    # quiet as python app.py: Spark's lines from the context on are off (what
    # spark-submit's own JVM printed before it started the app remains)
    spark_lines = [line for line in (out.stderr + out.stdout).splitlines()
                   if " INFO " in line or " WARN " in line]
    assert not [line for line in spark_lines if "Utils:" not in line], out.stderr[-3000:]
    assert len(spark_lines) <= 2, spark_lines  # the host name's warning, on some machines


def test_spark_submit_keeps_the_log_level_the_user_sets(tmp_path: Path) -> None:
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        submit = Path(shutil.which("spark-submit") or "spark-submit")
    (tmp_path / "app.py").write_text(APP)
    env = {**_env(), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    out = subprocess.run(
        [str(submit), "--master", "local[4]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.log.level=INFO", "app.py", "500"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT finished 500" in out.stdout
    assert "INFO DAGScheduler" in out.stderr + out.stdout, out.stderr[-3000:]
