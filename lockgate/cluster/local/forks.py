"""The driver's side of the local launcher's fork server
(:mod:`lockgate.cluster.local.forkserver`): one server per driver process, started
early (:func:`prestart`, while the job is being prepared) and shared by every
attempt and job of the process, so that restarting a task is a fork. It
imports the task code at its start and, told by :func:`prestart`, what the
job's tasks import beyond it (:func:`task_modules`: the connectors the job
uses and their client libraries, not every connector Lockgate has).

:meth:`ForkServer.spawn` starts a task and calls back with its exit code
when it ends (``None``: unknown, the server died first); :meth:`ForkServer.kill`
SIGKILLs it. The server is part of the job's fault model: its tasks die with
it (``PR_SET_PDEATHSIG``), a spawn it does not answer within
:data:`SPAWN_TIMEOUT` raises :class:`OSError` (and the server, stuck, is
killed), and a server that died or was killed is replaced by the next
:func:`server` call; the tasks it had started are watched until they are gone.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from lockgate.cluster.local.forkserver import HEADER

if TYPE_CHECKING:
    from lockgate.graph.jobgraph import JobGraph

log = logging.getLogger("lockgate.driver")

SPAWN_TIMEOUT = 60.0
"""Seconds a spawn waits for the server's answer (its imports come first)."""

OnExit = Callable[[int | None], None]


class ForkServer:
    def __init__(self) -> None:
        read, write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lockgate.cluster.local.forkserver", str(write)],
            stdin=subprocess.PIPE, pass_fds=(write,), env=env, start_new_session=True)
        os.close(write)
        self._replies = os.fdopen(read, "r")
        self._lock = threading.Lock()
        self._requests = itertools.count()
        self._pending: dict[int, tuple[threading.Event, list[int], OnExit]] = {}
        self._watched: dict[int, OnExit] = {}
        self.alive = True
        threading.Thread(target=self._read, daemon=True, name="forkserver-replies").start()

    def spawn(self, payload: bytes, on_exit: OnExit) -> int:
        """Start a task (its pickled ``(spec, coordinator, secret)``) in the
        driver's current environment and import path; its pid."""
        request = next(self._requests)
        done = threading.Event()
        pid: list[int] = []
        with self._lock:
            if not self.alive:
                raise OSError("the fork server is gone")
            self._pending[request] = (done, pid, on_exit)
        path = [p or os.getcwd() for p in sys.path]
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        deadline = time.monotonic() + SPAWN_TIMEOUT
        try:
            self._send(("spawn", request, payload, environ, path), deadline)
        except OSError:
            with self._lock:
                self._pending.pop(request, None)
            raise
        if not done.wait(max(0.0, deadline - time.monotonic())):
            self.end(f"it did not answer a spawn within {SPAWN_TIMEOUT:.0f} s")
        if not pid:
            with self._lock:
                self._pending.pop(request, None)
            raise OSError(f"the fork server did not start the task (it ended: exit code "
                          f"{self.proc.poll()})")
        return pid[0]

    def preload(self, modules: Iterable[str]) -> None:
        """Have the server import ``modules`` before it forks the next task
        (:class:`OSError` when it is gone)."""
        names = tuple(modules)
        if names:
            self._send(("preload", names), time.monotonic() + SPAWN_TIMEOUT)

    def end(self, why: str) -> None:
        """SIGKILL a server that stopped answering (its tasks die with it); the
        next :func:`server` call starts another."""
        log.warning("killing the local launcher's fork server (pid %d): %s", self.proc.pid, why)
        with self._lock:
            self.alive = False
        try:
            self.proc.kill()
        except OSError:
            pass

    def kill(self, pid: int) -> None:
        """SIGKILL task ``pid`` if it has not ended (the server knows: no
        recycled pid is ever hit)."""
        try:
            self._send(("kill", pid), time.monotonic() + 1.0)
        except OSError:  # the server is gone: its tasks are watched directly
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _send(self, request: tuple[object, ...], deadline: float) -> None:
        """Write one request; :class:`OSError` when the server is gone or has
        not read it by ``deadline`` (a stopped server: never block on it)."""
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(HEADER.pack(len(data)) + data)
        stdin = self.proc.stdin
        assert stdin is not None
        with self._lock:
            fd = stdin.fileno()
            os.set_blocking(fd, False)
            while view:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    raise OSError("the fork server does not read its requests")
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    continue

    def _read(self) -> None:
        try:
            for line in self._replies:
                match line.split():
                    case ["spawned", request, pid]:
                        with self._lock:
                            pending = self._pending.pop(int(request), None)
                            if pending is not None:
                                self._watched[int(pid)] = pending[2]
                        if pending is not None:
                            pending[1].append(int(pid))
                            pending[0].set()
                    case ["exited", pid, code]:
                        with self._lock:
                            on_exit = self._watched.pop(int(pid), None)
                        if on_exit is not None:
                            on_exit(int(code))
        except (OSError, ValueError):
            pass
        with self._lock:
            self.alive = False
            orphans = dict(self._watched)
            self._watched.clear()
            waiting = list(self._pending.values())
            self._pending.clear()
        for done, _, _ in waiting:
            done.set()
        if orphans:
            log.warning("the local launcher's fork server ended (exit code %s) with %d task(s) "
                        "running; watching them until they are gone", self.proc.poll(),
                        len(orphans))
            threading.Thread(target=_watch_orphans, args=(orphans,), daemon=True,
                             name="forkserver-orphans").start()


def _watch_orphans(orphans: dict[int, OnExit]) -> None:
    """Tasks whose server died are no children of ours: poll until each is gone."""
    while orphans:
        for pid in list(orphans):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                orphans.pop(pid)(None)
        time.sleep(0.02)


_server: ForkServer | None = None
_server_lock = threading.Lock()
_preloaded: dict[str, None] = {}
"""Every module :func:`prestart` was given: a server that replaces a dead
one imports them too."""


def server() -> ForkServer:
    """This driver process's fork server (a new one if it has none or it
    died, told to import what the one before it was)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive or _server.proc.poll() is not None:
            if _server is not None:  # it died or was killed: reaped, no zombie
                _server.proc.poll()
            _server = ForkServer()
            _server.preload(_preloaded)
        return _server


def prestart(modules: Iterable[str] = ()) -> None:
    """Start the fork server now and have it import ``modules`` (the job's
    :func:`task_modules`), so that its imports overlap the job's preparation."""
    names = [m for m in modules if m not in _preloaded]
    try:
        started = server()
        _preloaded.update(dict.fromkeys(names))
        started.preload(names)
    except OSError as e:  # the launcher falls back to a process per task
        log.warning("cannot start the local launcher's fork server: %s", e)


def task_modules(graph: JobGraph, storage: str) -> list[str]:
    """What the tasks of ``graph`` import beyond the task code: the modules
    of its runtime operators, the Lockgate modules of its operators'
    classes (its connectors), what its sources and
    sinks declare (``task_modules()``: their client libraries), pyarrow for
    Arrow operators, and ``pyarrow.fs`` for a checkpoint ``storage`` that is
    not on the local filesystem. A module a task needs and this misses is
    imported by the task itself: slower, never wrong."""
    from lockgate import fs
    from lockgate.api.plan import OperatorKind
    from lockgate.connectors.base import Sink, Source
    from lockgate.runtime.registry import modules_of

    names = dict.fromkeys(modules_of(op.kind for op in graph.operators()))
    for op in graph.operators():
        if op.kind in (OperatorKind.ARROW, OperatorKind.ARROW_AGGREGATE):
            names.update(dict.fromkeys(("pyarrow", "pyarrow.compute")))
        for obj in (op.fn, op.key_selector, op.watermarks):
            if obj is None:
                continue
            names.update(dict.fromkeys(
                c.__module__ for c in type(obj).__mro__ if c.__module__.startswith("lockgate.")))
            if isinstance(obj, (Source, Sink)):
                names.update(dict.fromkeys(obj.task_modules()))
    names.update(dict.fromkeys(fs.modules_for(storage)))
    return list(names)
