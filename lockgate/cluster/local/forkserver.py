"""The local launcher's fork server: ``python -m lockgate.cluster.local.forkserver FD``.

A fresh interpreter that imports the task code once and then forks one child
per task it is asked for, so a task starts in milliseconds instead of paying
for an interpreter and its imports (on two cores, four tasks starting at
once spent half a second importing). Spark's Python daemon does the same for
its workers; :mod:`lockgate.cluster.spark.daemon` preloads Lockgate there.

The driver (:mod:`lockgate.cluster.local.forks`) writes requests to stdin, each
``u32 length | pickle``: ``("spawn", request, payload, environ, sys_path)``,
``("kill", pid)`` or ``("preload", modules)``: module names the next tasks
import beyond the task code (their connectors and client libraries, as the
job declares them: :func:`lockgate.cluster.local.forks.task_modules`),
imported here once so that no forked task imports them; one that fails to
import is left to the tasks, which report the error. Replies go to file
descriptor ``FD`` as text lines: ``ready``, ``spawned <request> <pid>``,
``exited <pid> <exit code>`` (a negative code: the signal that killed it,
as ``subprocess`` reports it).
The pipe is private to the driver that started this process (nothing else
can write to it), and the payload is only unpickled in the child, by the
task code, as ``python -m lockgate.runtime.task_main`` would.

The server stays single-threaded (forking a process with threads is unsafe;
the one exception is a job whose tasks use pyarrow, whose import starts its
allocator's background thread, ``jemalloc_bg_thd``, as in Spark's daemon),
reaps its children, kills only children it has not reaped (so a kill never
reaches a recycled pid), and exits when the driver closes its stdin (the
driver ended, or was killed). A task it forked dies with it
(``PR_SET_PDEATHSIG``): no task outlives the server that started it, and the
driver counts a dead server as a failure of every task it ran.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import select
import signal
import struct
import sys
import time
import traceback
from typing import Any

from lockgate.runtime.task_main import die_with_parent, end_child, preload, run_payload

HEADER = struct.Struct(">I")
MAX_REQUEST = 1 << 30
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _preload(modules: object) -> None:
    """Import what the next tasks need (a failure is theirs to report)."""
    if not isinstance(modules, (list, tuple)):
        return
    for name in modules:
        if not isinstance(name, str) or not _MODULE.fullmatch(name):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # the task that imports it reports it
            pass


def _child(request: tuple[Any, ...], closing: list[int], server: int) -> None:
    """In the forked child: become the task, never return."""
    code = 1
    try:
        entry = time.time()
        die_with_parent(server)
        os.setsid()  # as start_new_session: no signal of the driver's group
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the request pipe is the server's alone
        os.close(devnull)
        _, _, payload, environ, path = request
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
        code = run_payload(payload, {"entry": entry})
    except BaseException:
        traceback.print_exc()
    finally:
        end_child(code)


def serve(replies: int) -> None:
    preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    out = os.fdopen(replies, "w", buffering=1)
    out.write("ready\n")
    children: set[int] = set()
    me = os.getpid()
    buffer = b""
    open_input = True
    while open_input:
        ready, _, _ = select.select([0, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if 0 in ready:
            chunk = os.read(0, 1 << 20)
            open_input = bool(chunk)
            buffer += chunk
            while len(buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer)
                if size > MAX_REQUEST:
                    raise ValueError(f"request of {size} bytes")
                if len(buffer) < HEADER.size + size:
                    break
                request = pickle.loads(buffer[HEADER.size:HEADER.size + size])
                buffer = buffer[HEADER.size + size:]
                if request[0] == "spawn":
                    pid = os.fork()
                    if pid == 0:
                        _child(request, [wake_r, wake_w, replies], me)
                    children.add(pid)
                    out.write(f"spawned {request[1]} {pid}\n")
                elif request[0] == "preload":
                    _preload(request[1])
                elif request[0] == "kill" and request[1] in children:
                    try:
                        os.kill(request[1], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        while children:  # reap
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            out.write(f"exited {pid} {os.waitstatus_to_exitcode(status)}\n")


def main() -> None:
    try:
        with open("/proc/self/comm", "w") as f:
            f.write("lgforkserver")
    except OSError:
        pass
    try:
        serve(int(sys.argv[1]))
    except BrokenPipeError:
        # the driver is gone (e.g. it refused the job before starting it):
        # nothing to report to; running children notice the lost control
        # connection and end on their own
        os._exit(0)


if __name__ == "__main__":
    main()
