"""A job on a real Spark standalone cluster: a Master and a Worker JVM on
loopback (started from PySpark's own ``spark-class``), the job submitted by
``lockgate run --master spark://...`` — the path a user takes on a cluster,
where the driver's listeners bind ``spark.driver.host`` and tasks bind their
executor's address. A Python worker is SIGKILLed mid-run; the output is exact."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault.checks import spark_host_of, task_processes
from tests.fixtures import check_exact_sums
from tests.integration.spark_daemons import spark_env, start_master, start_worker, stop

APP = """
import sys
from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource

n, out, chk = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pipeline = Pipeline("standalone-sums", parallelism=2,
                    checkpoint=CheckpointConfig(interval=0.2, storage=chk),
                    restart=FixedDelayRestart(max_attempts=5, delay_s=0.0))
(pipeline.source(SequenceSource(1, n, rate=15_000), uid="numbers")
    .map(lambda x: (x % 3, x), uid="pairs")
    .key_by(lambda kv: kv[0])
    .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
    .sink(FileSink(out, format="jsonl"), uid="out"))
"""
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Path]]:
    """``spark://127.0.0.1:<port>`` of a Master with one Worker of 4 cores,
    the Worker's pid (its executors' Python workers run the tasks) and its
    work folder (the executors' stdout and stderr)."""
    logs = tmp_path_factory.mktemp("spark-daemons")
    url, master = start_master(logs)
    try:
        worker = start_worker(url, logs, cores=4)
        try:
            yield url, worker.pid, logs / "worker-work"
        finally:
            stop(worker)
    finally:
        stop(master)


def test_job_on_a_standalone_cluster_survives_a_killed_task_and_host(
        cluster: tuple[str, int, Path], tmp_path: Path) -> None:
    url, worker, _ = cluster
    (tmp_path / "app.py").write_text(APP)
    n = 100_000
    out, chk = tmp_path / "out", tmp_path / "chk"
    driver = subprocess.Popen(
        [sys.executable, "-m", "lockgate.cli", "run", "app.py:pipeline", "--master", url,
         str(n), str(out), str(chk)],
        cwd=tmp_path, env=spark_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    checkpoints = threading.Semaphore(0)

    def read_stderr() -> None:
        assert driver.stderr is not None
        for line in driver.stderr:
            stderr.append(line)
            if "] checkpoint " in line:
                checkpoints.release()

    stdout_parts: list[str] = []

    def read_stdout() -> None:
        assert driver.stdout is not None
        stdout_parts.append(driver.stdout.read())

    # each pipe has one reader of its own (communicate() would read, and
    # close, stderr under the stderr reader)
    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=read_stdout, daemon=True)]
    for reader in readers:
        reader.start()
    try:
        for _ in range(3):  # three checkpoints completed: records are flowing
            assert checkpoints.acquire(timeout=240), "".join(stderr)[-3000:]
        # the tasks are Python workers of the Worker's executor, not the driver's children
        worker_pids = {pid for pid, (attempt, _) in task_processes(worker).items()
                       if attempt == 0}
        assert worker_pids, "no task process found"
        os.kill(max(worker_pids), signal.SIGKILL)  # a task: the next attempt is a fork
        for _ in range(2):  # attempt 1 runs and checkpoints
            assert checkpoints.acquire(timeout=240), "".join(stderr)[-3000:]
        hosts = {spark_host_of(pid) for pid, (attempt, _) in task_processes(worker).items()
                 if attempt == 1}
        assert hosts and None not in hosts, hosts  # attempt 1 ran on the same kind of hosts
        os.kill(max(h for h in hosts if h is not None), signal.SIGKILL)  # a host: a new stage
        driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    for reader in readers:
        reader.join(10)
    stdout = "".join(stdout_parts)
    log = "".join(stderr)
    assert driver.returncode == 0, log[-3000:]
    assert f"{n} records in, {n} out" in stdout, stdout
    assert "2 restarts" in stdout, stdout
    # plain local paths on a cluster: the driver warns they must be shared
    assert "plain local path" in log and "file://" in log, log[-3000:]
    check_exact_sums(out, n, 3)


def test_relative_paths_on_a_cluster_are_the_drivers_and_warned_of(
        cluster: tuple[str, int, Path], tmp_path: Path) -> None:
    """``FileSink("out")`` with the driver in ``tmp_path``: the tasks run in
    their executor's work folder, yet the output lands in the driver's
    ``tmp_path/out`` (resolved in the driver, like checkpoint storage), and
    the driver warns that the sink's plain path must be shared. Neither the
    driver's JVM nor the executors' (started with the JAVA_HOME Lockgate
    gives Spark) warn of the incubator module."""
    url, _, work = cluster
    (tmp_path / "app.py").write_text(APP)
    n = 3_000
    result = subprocess.run(
        [sys.executable, "-m", "lockgate.cli", "run", "app.py:pipeline", "--master", url,
         str(n), "out", "chk"],
        cwd=tmp_path, env=spark_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    check_exact_sums(tmp_path / "out", n, 3)
    assert re.search(r"sink 'out' is the plain local path \S*out", result.stderr), \
        result.stderr[-3000:]
    assert "Using incubator modules" not in result.stderr, result.stderr[-3000:]
    executor_logs = list(work.glob("app-*/*/stderr"))
    assert executor_logs, sorted(work.rglob("*"))
    for path in executor_logs:
        assert "Using incubator modules" not in path.read_text(errors="replace"), path
