"""The ``spark`` launcher on real Spark, in local mode: one SparkSession for
the module (a cold session takes ~8 s, a job on a warm one ~0.2 s)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lockgate.cluster.spark.launcher import SparkLauncher
from lockgate.cluster.spark.session import SESSION_CONF
from lockgate.errors import ConfigurationError
from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums
from tests.integration.spark_session import fresh_spark_session

SLOTS = 4  # the sums job at parallelism 2 has 4 tasks


@pytest.fixture(scope="module")
def spark():
    # with the daemon of the sessions Lockgate starts (its workers preloaded)
    session = fresh_spark_session(
        SLOTS, "lockgate-tests",
        **{"spark.python.daemon.module": SESSION_CONF["spark.python.daemon.module"]})
    yield session
    session.stop()


@pytest.fixture
def launchers(monkeypatch):
    """Every SparkLauncher the job master starts, in order (one per attempt)."""
    started: list[SparkLauncher] = []
    original = SparkLauncher.start

    def start(self, specs, coordinator, secret):
        started.append(self)
        original(self, specs, coordinator, secret)

    monkeypatch.setattr(SparkLauncher, "start", start)
    return started


def test_sums_exact_on_spark(spark, launchers, tmp_path: Path) -> None:
    n = 20_000
    p = build(n, 2, 2, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    result = p.run(launcher="spark", spark=spark)
    assert result.restarts == 0
    assert (result.records_in, result.records_out) == (n, n)
    check_exact_sums(tmp_path / "out", n, 2)
    assert len(launchers) == 1
    assert launchers[0].pids() == {}  # every task of the attempt is gone


def _parent_cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


@pytest.mark.parametrize("victim", ["task", "host"])
def test_sigkill_restarts_from_the_checkpoint(spark, launchers, tmp_path: Path,
                                              victim: str) -> None:
    """A killed task is a fork on the same hosts (the stage lives on); a killed
    host (the Spark Python worker) costs a new stage. Exact either way."""
    n = 60_000
    p = build(n, 2, 2, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2, rate=30_000)
    checkpointed = threading.Event()
    killed: dict[str, object] = {}

    def on_progress(progress) -> None:
        if progress.checkpoints_completed >= 2:
            checkpointed.set()
        if progress.restarts == 1 and "after" not in killed:
            killed["after"] = launchers[-1].host_pids()  # the hosts of attempt 1

    def killer() -> None:
        if not checkpointed.wait(60):
            return
        pids = launchers[0].pids()
        hosts = launchers[0].host_pids()
        killed["hosts"] = dict(hosts)
        task = min(pids)  # the first source task
        target = pids[task] if victim == "task" else hosts[task]
        killed["parent"] = _parent_cmdline(target)
        killed["at"] = time.monotonic()
        os.kill(target, signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = p.run(launcher="spark", spark=spark, on_progress=on_progress)
    thread.join()
    assert "at" in killed, "the job ended before the kill"
    # a task is forked by its host, a Spark Python worker forked by Spark's
    # daemon (Lockgate's, which preloads the task code): both show its command line
    assert "lockgate.cluster.spark.daemon" in str(killed["parent"])
    assert result.restarts >= 1
    assert len(launchers) == result.restarts + 1
    if victim == "task":  # the next attempt ran on the same hosts: no new Spark job
        assert launchers[1].reused_stage
        assert killed["after"] == killed["hosts"]
    else:
        assert not launchers[1].reused_stage
        assert killed["after"] and set(killed["after"].values()).isdisjoint(  # type: ignore[union-attr]
            killed["hosts"].values())  # type: ignore[union-attr]
    # restored from a completed checkpoint, and nothing read or written twice
    assert (result.records_in, result.records_out) == (n, n)
    check_exact_sums(tmp_path / "out", n, 2)
    assert result.recovery_times and max(result.recovery_times) < 10
    for launcher in launchers:
        assert launcher.pids() == {}
    assert launchers[-1].host_pids() == {}  # the job released its stage


def test_too_few_slots_fails_fast_with_a_clear_message(spark, launchers,
                                                       tmp_path: Path) -> None:
    p = build(100, 3, 2, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)  # 6 tasks
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as info:
        p.run(launcher="spark", spark=spark)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert "needs 6 task slots" in message
    assert f"has {SLOTS}" in message
    assert "local[6]" in message and "executor" in message
    assert launchers == []  # nothing was submitted
