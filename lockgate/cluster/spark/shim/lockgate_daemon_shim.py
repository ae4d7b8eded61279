"""Spark's Python daemon in a session Lockgate started in local mode: hands
its standard streams to the warm daemon the driver started
(:mod:`lockgate.cluster.spark.warm`), whose imports are done, and waits for
it to end; without one it runs :mod:`lockgate.cluster.spark.daemon`.

A top-level module (its folder is on the daemon's ``PYTHONPATH``) that
imports only the standard library: ``python -m lockgate.cluster...`` would
first import the ``lockgate`` package, half a second of the time it saves.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from types import FrameType

ENV = "LOCKGATE_SPARK_WARM_DAEMON"
"""The warm daemon's Unix socket (set by the driver in the executors' environment)."""


def hand_off(path: str) -> int | None:
    """Give the warm daemon at ``path`` this process's stdin, stdout and
    stderr (what Spark talks to) and wait until it ends; its exit code
    (0), or None when no warm daemon took them (then nothing was sent on
    stdout: the caller runs the daemon itself)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        info = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv,
                           "path": sys.path, "executable": sys.executable}).encode()
        socket.send_fds(conn, [len(info).to_bytes(4, "big")], [0, 1, 2])
        conn.sendall(info)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(256)
            if not chunk:
                break
            answer += chunk
    except OSError:
        return None
    finally:
        conn.close()
    if not answer.startswith(b"ok "):
        return None
    pid = int(answer.split()[1])

    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            os.kill(pid, signum)  # Spark stops its daemon with SIGTERM
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0
    except OSError:  # pragma: no cover - a kernel before 5.3
        while _alive(pid):
            select.select([], [], [], 0.5)
        return 0
    select.select([fd], [], [])  # readable once the warm daemon ended
    return 0


def _alive(pid: int) -> bool:  # pragma: no cover - a kernel before 5.3
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    path = os.environ.pop(ENV, None)
    if path:
        code = hand_off(path)
        if code is not None:
            sys.exit(code)
    from lockgate.cluster.spark.daemon import main as daemon_main

    daemon_main()


if __name__ == "__main__":
    main()
