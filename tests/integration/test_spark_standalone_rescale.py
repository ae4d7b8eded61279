"""A rescale to more tasks than a real Spark standalone cluster has slots
for (a Master and Workers on loopback, started from PySpark's own
``spark-class``): the job runs on while the rescale waits
``spark.scheduler.maxRegisteredResourcesWaitingTime`` for executors; then
either it is refused with the numbers and the fix (nothing happened to the
job), or a Worker that joined in the meantime gives the slots and the job
goes on at the new parallelism. Either way the output is exact. A job too
big for the cluster is refused at its start the same way."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import check_exact_sums
from tests.integration.spark_daemons import (
    await_worker,
    spark_env,
    start_master,
    start_worker,
    stop,
)

APP = """
import json, os, sys, threading, time
os.environ["PYSPARK_PYTHON"] = sys.executable
url, n, out, chk, gate, wait, probe, repo = sys.argv[1:9]
n = int(n)
sys.path.insert(0, repo)
import cloudpickle
from pyspark import SparkConf, SparkContext
from lockgate import CheckpointConfig, Pipeline
from lockgate.cluster.spark.session import task_slots
from lockgate.connectors import FileSink
from lockgate.connectors.sequence import SequenceSource
from lockgate.errors import ConfigurationError
import tests.fault.held_source
from tests.fault.held_source import HeldSequence

# the executors cannot import the tests: the source goes to them by value
cloudpickle.register_pickle_by_value(tests.fault.held_source)


def say(**event):
    print(json.dumps(event), flush=True)


sc = SparkContext(conf=SparkConf().setMaster(url).setAppName("standalone-rescale")
                  .set("spark.scheduler.maxRegisteredResourcesWaitingTime", wait)
                  .set("spark.ui.enabled", "false"))
sc.setLogLevel("ERROR")
deadline = time.monotonic() + 120
while task_slots(sc) < 2 and time.monotonic() < deadline:  # the first worker's executor
    time.sleep(0.2)

if probe == "yes":  # a job of 4 tasks does not start on 2 slots: the reason, at once
    too_big = Pipeline("too-big", parallelism=2)
    (too_big.source(SequenceSource(1, 10), uid="numbers").key_by(lambda x: x % 2)
        .reduce(lambda a, b: a + b, uid="sums").sink(FileSink(out + "-too-big"), uid="out"))
    try:
        too_big.run(spark=sc)
    except ConfigurationError as e:
        say(event="too big", message=str(e))

pipeline = Pipeline("standalone-rescale", parallelism=1,
                    checkpoint=CheckpointConfig(interval=0.3, storage=chk))
# the last number of every split is held back until the file `gate` exists:
# the job cannot end before the test is done with it
(pipeline.source(HeldSequence(1, n, rate=2_000, gate=gate), uid="numbers")
    .map(lambda x: (x % 3, x), uid="pairs")
    .key_by(lambda kv: kv[0])
    .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
    .sink(FileSink(out, format="jsonl"), uid="out"))
completed = [0]
progress = threading.Condition()


def on_progress(p):
    with progress:
        completed[0] = p.checkpoints_completed
        progress.notify_all()


def checkpoints(k):
    with progress:
        seen = completed[0]
        assert progress.wait_for(lambda: completed[0] >= seen + k, timeout=240), completed


client = pipeline.start(spark=sc, on_progress=on_progress, progress=False)
checkpoints(2)
say(event="asking", slots=task_slots(sc), attempt=client.status()["attempt"])
started = time.monotonic()
try:
    answer = client.rescale(2, timeout=300)
    say(event="rescaled", parallelism=answer["parallelism"], slots=task_slots(sc),
        seconds=time.monotonic() - started, attempt=client.status()["attempt"])
except Exception as e:
    say(event="refused", message=str(e), seconds=time.monotonic() - started,
        status=client.status()["status"], attempt=client.status()["attempt"])
checkpoints(2)  # the job runs on
say(event="running", status=client.status()["status"])
open(gate, "w").close()
result = client.result(timeout=300)
say(event="result", status=result.status.value, restarts=result.restarts)
"""
N = 20_000
REPO = Path(__file__).resolve().parents[2]



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Master with one Worker of 2 cores (2 task slots), and its logs' folder."""
    logs = tmp_path_factory.mktemp("spark-daemons")
    url, master = start_master(logs)
    try:
        worker = start_worker(url, logs, cores=2)
        try:
            yield url, logs
        finally:
            stop(worker)
    finally:
        stop(master)


class Driver:
    """The app above in a process of its own; its events as they come."""

    def __init__(self, tmp_path: Path, url: str, wait: str, probe: bool = False) -> None:
        (tmp_path / "app.py").write_text(APP)
        self.out, self.gate = tmp_path / "out", tmp_path / "gate"
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", url, str(N), str(self.out), str(tmp_path / "chk"),
             str(self.gate), wait, "yes" if probe else "no", str(REPO)],
            cwd=tmp_path, env=spark_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.events: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        self.stderr: list[str] = []
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self.arrived:
                    self.events.append(json.loads(line))
                    self.arrived.notify_all()
        with self.arrived:
            self.events.append({"event": "exit"})
            self.arrived.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def event(self, name: str, timeout: float = 300) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events if e["event"] in (name, "exit")), None)

        with self.arrived:
            self.arrived.wait_for(found, timeout=timeout)
            event = found()
        assert event is not None and event["event"] == name, (event, self.log())
        return event

    def log(self) -> str:
        return "".join(self.stderr)[-4000:]

    def runs_on_and_finishes(self) -> None:
        """The job still runs after the rescale's answer, then (the app opens
        the gate) finishes with no restart, and the app exits cleanly."""
        assert self.event("running")["status"] == "running"
        result = self.event("result")
        assert result["status"] == "finished" and result["restarts"] == 0, result
        assert self.proc.wait(60) == 0, self.log()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_rescale_beyond_the_cluster_is_refused_after_the_wait_and_the_job_runs_on(
        cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = cluster
    driver = Driver(tmp_path, url, "3s", probe=True)
    try:
        # first a job too big for the cluster: refused at its start, naming the slots
        message = driver.event("too big")["message"]
        assert f"needs 4 task slots at once, but the Spark application (master {url}) " \
               "has 2, and no more registered within 3 s (spark.scheduler." \
               "maxRegisteredResourcesWaitingTime)" in message, message
        assert "standalone: more workers" in message and "local[" not in message, message
        asking = driver.event("asking")
        assert asking["slots"] == 2 and asking["attempt"] == 0
        refused = driver.event("refused")
        message = refused["message"]
        # the numbers, the setting it waited for, and the fixes
        assert "the rescale to 4 tasks is refused, the job goes on at its parallelism " \
               "(2 tasks)" in message, message
        assert "needs 4 task slots at once" in message and f"(master {url}) has 2" in message
        assert "within 3 s (spark.scheduler.maxRegisteredResourcesWaitingTime)" in message
        assert "start another worker" in message and "at most 2 tasks" in message, message
        assert refused["seconds"] >= 2.5, refused  # it waited for executors
        assert refused["status"] == "running" and refused["attempt"] == 0, refused
        driver.runs_on_and_finishes()
    finally:
        driver.end()
    check_exact_sums(driver.out, N, 3)


def test_a_worker_that_joins_within_the_wait_lets_the_rescale_go_through(
        cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, logs = cluster
    driver = Driver(tmp_path, url, "150s")
    joining: subprocess.Popen[bytes] | None = None
    try:
        assert driver.event("asking")["slots"] == 2
        # the rescale waits: a second worker of 2 cores joins, and Spark's
        # Master gives the application an executor on it
        joining = start_worker(url, logs, cores=2, name="joining", wait=False)
        await_worker(logs, joining, "joining")
        rescaled = driver.event("rescaled")
        assert rescaled["parallelism"] == 2 and rescaled["slots"] == 4, rescaled
        assert rescaled["attempt"] == 1, rescaled  # a rescale, not a restart
        driver.runs_on_and_finishes()
    finally:
        driver.end()
        if joining is not None:
            stop(joining)
    check_exact_sums(driver.out, N, 3)
