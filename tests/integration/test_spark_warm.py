"""The warm Spark daemon (lockgate/cluster/spark/warm.py): the driver's
pre-imported process takes over the streams of the daemon Spark starts (the
shim), forks the workers, and ends with its stdin; without it (refused, or
gone) the shim is the daemon itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from lockgate.cluster.spark import warm as spark_warm


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _start_warm(path: Path, seed: str = "0") -> subprocess.Popen[bytes]:
    path.parent.mkdir(exist_ok=True)  # private to it, as the driver's: removed with it
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONUNBUFFERED": "YES"}
    warm = subprocess.Popen([sys.executable, "-m", "lockgate.cluster.spark.warm", str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while not path.exists():
        assert warm.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    return warm


def _start_shim(path: Path, seed: str = "0") -> subprocess.Popen[bytes]:
    """The daemon as Spark starts it: ``python -m <module>``, the worker
    factory's secret in its environment, pipes on stdin and stdout."""
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONUNBUFFERED": "YES",
           "PYTHON_WORKER_FACTORY_SECRET": "s3cret", spark_warm.ENV: str(path),
           "PYTHONPATH": os.pathsep.join([spark_warm.SHIM_PATH, *sys.path])}
    # (stderr: the worker's EOFError when the test hangs up instead of running a task)
    return subprocess.Popen([sys.executable, "-m", spark_warm.SHIM], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)


def _fork_a_worker(shim: subprocess.Popen[bytes]) -> int:
    """What Spark does: read the daemon's port on its stdout, connect, read
    the new worker's pid."""
    assert shim.stdout is not None
    port = int.from_bytes(shim.stdout.read(4), "big")
    assert 0 < port < 65536
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        pid = int.from_bytes(conn.recv(4), "big")
        parent = _ppid(pid)
    return parent


def test_the_warm_process_becomes_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "warm" / "daemon"
    warm = _start_warm(path)
    shim = _start_shim(path)
    try:
        assert _fork_a_worker(shim) == warm.pid  # forked by the warm process
        assert not path.exists()  # taken: nobody else can connect
        assert shim.poll() is None  # the shim stays while the daemon runs
    finally:
        assert shim.stdin is not None
        shim.stdin.close()  # Spark's end: the daemon ends with its stdin
        warm.wait(60)  # (PySpark's daemon exits 1 even then)
        assert shim.wait(60) == 0


def test_the_shim_runs_the_daemon_itself_when_refused(tmp_path: Path) -> None:
    path = tmp_path / "warm" / "daemon"
    warm = _start_warm(path, seed="0")
    shim = _start_shim(path, seed="1")  # hashes unlike the warm process: refused
    try:
        assert _fork_a_worker(shim) == shim.pid
        assert warm.wait(60) == 0  # it had one chance
        assert not path.exists()
    finally:
        assert shim.stdin is not None
        shim.stdin.close()
        shim.wait(60)


def test_a_warm_process_ends_with_its_driver(tmp_path: Path) -> None:
    path = tmp_path / "warm" / "daemon"
    warm = _start_warm(path)
    assert warm.stdin is not None
    warm.stdin.close()  # the driver ended before Spark asked for a daemon
    assert warm.wait(60) == 0
    assert not path.parent.exists()  # its socket and folder are gone with it
    # and a shim then finds nobody and runs the daemon itself
    shim = _start_shim(path)
    try:
        assert _fork_a_worker(shim) == shim.pid
    finally:
        assert shim.stdin is not None
        shim.stdin.close()
        shim.wait(60)


SESSION = """
import json, os, sys, time
from lockgate.cluster.spark import warm as spark_warm
from lockgate.cluster.spark import session as spark_session

sc = spark_session.spark_context(None, "local[2]", 2, "warm-test")
warm = [p.pid for p in spark_warm._started]
if sys.argv[1] == "kill":
    for p in spark_warm._started:
        p.kill()
        p.wait()
parents = sc.parallelize([0, 1], 2).barrier().mapPartitions(
    lambda it: [os.getppid()]).collect()
print(json.dumps({"warm": warm, "parents": parents}))
"""


def _session(tmp_path: Path, mode: str) -> dict[str, list[int]]:
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["LOCKGATE_SPARK_CDS"] = "0"  # no background build from this test
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, list[int]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_local_session_forks_its_workers_from_the_warm_process(tmp_path: Path) -> None:
    result = _session(tmp_path, "keep")
    assert len(result["warm"]) == 1
    assert set(result["parents"]) == set(result["warm"])
    # without it (it died before Spark asked), the shim preloads and forks itself
    result = _session(tmp_path, "kill")
    assert len(result["warm"]) == 1 and not set(result["parents"]) & set(result["warm"])
