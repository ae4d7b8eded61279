"""A warm Spark daemon: Spark's Python daemon with its imports done while
the driver's JVM starts.

Spark starts its Python daemon (``python -m <spark.python.daemon.module>``)
when the first job's first task runs, and the daemon imports
``pyspark.worker`` and Lockgate's task code
(:mod:`lockgate.cluster.spark.daemon`) before it can fork a worker: about a
second of a cold start, after the JVM and SparkContext started. In a local
session Lockgate starts, the driver starts that process itself, before the
JVM (:func:`start`), so its imports run while the JVM starts:

Step 1. :func:`start` runs ``python -m lockgate.cluster.spark.warm``: it
        listens on a Unix socket in a private folder, imports the task code,
        and waits. The session's daemon module is the shim
        ``lockgate_daemon_shim`` (``lockgate/cluster/spark/shim``), the socket's
        path in the executors' environment.
Step 2. When Spark starts its daemon, the shim connects and sends its
        stdin, stdout and stderr (SCM_RIGHTS), its environment, folder,
        ``sys.argv`` and ``sys.path``.
Step 3. The warm process checks the sender is this user, that it runs the
        same interpreter with the same hash seed (fixed at start-up), takes
        over the streams, environment and folder, answers with its pid and
        runs PySpark's daemon loop (``pyspark.daemon.manager``): Spark reads
        the port from the shim's stdout and sends worker pids to kill on its
        stdin as before, and the daemon ends when that stdin closes.
Step 4. The shim stays until the warm daemon ends (Spark watches the process
        it started) and forwards SIGTERM, which Spark stops a daemon with.

Without a warm process (it ended, a refusal, a restarted daemon) the shim
runs :mod:`lockgate.cluster.spark.daemon` itself, as before. A warm process
whose driver ends before Spark asked for it ends too (its stdin is a pipe
from the driver).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any

log = logging.getLogger("lockgate.driver")

SHIM = "lockgate_daemon_shim"
"""The daemon module of a session with a warm daemon."""
SHIM_PATH = os.path.join(os.path.dirname(__file__), "shim")
"""The folder of :data:`SHIM` (put on the daemon's ``PYTHONPATH``)."""
ENV = "LOCKGATE_SPARK_WARM_DAEMON"
SWITCH = "LOCKGATE_SPARK_WARM"
"""``0`` turns the warm daemon off."""


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def start() -> dict[str, str]:
    """Start a warm daemon for the session about to start; the settings of
    that session that make Spark's daemon use it (none when it is off)."""
    if not enabled():
        return {}
    folder = tempfile.mkdtemp(prefix="lockgate-warm-")  # private (0700)
    path = os.path.join(folder, "daemon")
    env = {**os.environ, "PYTHONUNBUFFERED": "YES",
           # fixed at start-up: the seed Spark gives its daemon
           "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "lockgate.cluster.spark.warm", path],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                                close_fds=True,
                                # the terminal's Ctrl-C is the driver's, from the start
                                # (its imports too)
                                preexec_fn=_ignore_sigint)
    except OSError as e:
        log.debug("no warm Spark daemon: %s", e)
        shutil.rmtree(folder, ignore_errors=True)
        return {}
    _started.append(proc)
    threading.Thread(target=_reap, args=(proc, folder), daemon=True,
                     name="spark-warm-daemon").start()
    python_path = os.pathsep.join(p for p in (SHIM_PATH, os.environ.get("PYTHONPATH")) if p)
    return {"spark.python.daemon.module": SHIM,
            f"spark.executorEnv.{ENV}": path,
            "spark.executorEnv.PYTHONPATH": python_path}


_started: list[subprocess.Popen[bytes]] = []
"""The warm processes of this driver (their stdin pipes stay open while it runs)."""


def started() -> list[subprocess.Popen[bytes]]:
    """The warm processes of this driver that were not reaped yet."""
    return list(_started)


def stop(settings: dict[str, str]) -> None:
    """End the warm process of a session's ``settings`` that will not start
    (the job was refused): its stdin closes, and it ends unless Spark took it."""
    path = settings.get(f"spark.executorEnv.{ENV}")
    for proc in list(_started):
        if path is not None and proc.args[-1] == path and proc.stdin is not None:  # type: ignore[index]
            try:
                proc.stdin.close()
            except OSError:
                pass


def _reap(proc: subprocess.Popen[bytes], folder: str) -> None:
    proc.wait()
    shutil.rmtree(folder, ignore_errors=True)
    if proc in _started:
        _started.remove(proc)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ------------------------------------------------------- the warm process
def serve(path: str) -> int:
    """The warm process: listen, preload, wait for the shim (or the
    driver's end), then become Spark's daemon."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is not ours
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    try:
        if not _wait_for_shim(listener):
            return 0
    finally:  # nobody else can connect from now on, and nothing is left in /tmp
        listener.close()
        _cleanup(path)
    from pyspark.daemon import manager

    manager()  # exits the process
    return 0


def _wait_for_shim(listener: socket.socket) -> bool:
    """Preload, then wait for the shim; whether its streams were taken (not
    when the driver ended first, the preload failed, or the shim was
    refused: it then runs the daemon itself)."""
    from lockgate.cluster.spark.daemon import preload

    try:
        preload()
    except Exception as e:
        print(f"lockgate: warm Spark daemon preload failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        return False
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(0, 1):
            return False  # the driver ended before Spark asked for its daemon
        if listener in ready:
            conn, _ = listener.accept()
            with conn:
                return _take(conn)


def _take(conn: socket.socket) -> bool:
    """Take over the shim's streams and surroundings, or refuse (the shim
    then runs the daemon itself)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    try:
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        if len(head) < 4 or len(fds) != 3:
            raise ValueError("no streams received")
        size = int.from_bytes(head, "big")
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise ValueError("the shim went away")
            data += chunk
        info: dict[str, Any] = json.loads(data)
    except (OSError, ValueError) as e:
        print(f"lockgate: warm Spark daemon: {e}", file=sys.stderr)
        return False
    why = refusal(info, uid)
    if why is not None:
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(f"no {why}\n".encode())
        except OSError:
            pass
        return False
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(info["env"])
    os.chdir(info["cwd"])
    sys.argv[:] = info["argv"]
    sys.path[:] = info["path"]
    conn.sendall(f"ok {os.getpid()}\n".encode())
    return True


def refusal(info: dict[str, Any], uid: int) -> str | None:
    """Why the warm process cannot be the daemon the shim would have been:
    another user, another interpreter, or a hash seed other than the one
    this interpreter started with (Spark's workers must hash alike)."""
    if uid != os.getuid():
        return f"uid {uid} is not {os.getuid()}"
    if info.get("executable") != sys.executable:
        return f"the shim runs {info.get('executable')}, not {sys.executable}"
    env = info.get("env") or {}
    seed = os.environ.get("PYTHONHASHSEED")
    if env.get("PYTHONHASHSEED") != seed:
        return f"PYTHONHASHSEED {env.get('PYTHONHASHSEED')!r} is not {seed!r}"
    return None


def _cleanup(path: str) -> None:
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
