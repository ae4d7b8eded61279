"""A Spark standalone cluster on loopback for tests: a Master and Workers,
each a JVM started from PySpark's own ``spark-class`` (the pip package has no
``sbin/`` scripts), in a session of its own so that the test ends it whole."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

STARTUP = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env() -> dict[str, str]:
    """The environment of the daemons and of a driver run against them."""
    import pyspark

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env.update(SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1")
    if "JAVA_HOME" not in env:
        from lockgate.cluster.spark.java import ensure_java

        ensure_java()
        env["JAVA_HOME"] = os.environ.get("JAVA_HOME", "")
    return env


def await_line(log: Path, pattern: str, proc: subprocess.Popen[bytes],
               timeout: float = STARTUP) -> None:
    """Wait for a daemon to log ``pattern`` (its readiness: there is no other event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text(errors="replace")):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"Spark daemon not ready ({pattern!r}):\n{log.read_text()[-3000:]}")


def start_master(logs: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """``spark://127.0.0.1:<port>`` of a new Master, and its process."""
    env = spark_env()
    port = free_port()
    with open(logs / "master.log", "wb") as log:
        master = subprocess.Popen(
            [_spark_class(env), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await_line(logs / "master.log", r"New state: ALIVE", master)
    except BaseException:
        stop(master)
        raise
    return f"spark://127.0.0.1:{port}", master


def start_worker(url: str, logs: Path, cores: int, name: str = "worker",
                 wait: bool = True) -> subprocess.Popen[bytes]:
    """A Worker of ``cores`` cores registered with the Master at ``url``
    (``wait=False``: returns once it is started; :func:`await_worker` waits)."""
    env = spark_env()
    with open(logs / f"{name}.log", "wb") as log:
        worker = subprocess.Popen(
            [_spark_class(env), "org.apache.spark.deploy.worker.Worker", url, "--host",
             "127.0.0.1", "--cores", str(cores), "--memory", "2g",
             "--webui-port", str(free_port()), "--work-dir", str(logs / f"{name}-work")],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if wait:
        await_worker(logs, worker, name)
    return worker


def await_worker(logs: Path, worker: subprocess.Popen[bytes], name: str = "worker") -> None:
    try:
        await_line(logs / f"{name}.log", r"Successfully registered with master", worker)
    except BaseException:
        stop(worker)
        raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a daemon and every process of its session (its executors)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _spark_class(env: dict[str, str]) -> str:
    return os.path.join(env["SPARK_HOME"], "bin", "spark-class")
