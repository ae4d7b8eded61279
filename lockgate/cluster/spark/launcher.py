"""The ``spark`` launcher: every task of an attempt runs in a task slot of
the job's Spark barrier stage.

The stage (:mod:`lockgate.cluster.spark.stage`) is long-lived: Spark
gang-schedules one *host* per task (all start together or none), and each
host forks a child per attempt that runs the Lockgate task with the same
entry point as the local launcher (``TaskSpec``, coordinator address,
secret). A restart after a task died is a fork in every host; only a lost host
(its executor or Python worker) costs a new stage, since Spark never retries a
barrier stage whose task died.

Before it runs anything, a task takes a *lease* from this launcher: one
authenticated TCP connection to a listener the launcher opens next to the
control server, with the task's pid and host. The lease is how the launcher
knows which tasks of its attempt exist and when each is gone (the connection
closes when the task returns or its process dies), so ``stop`` can guarantee
what the local launcher guarantees with ``wait()``: no task of the attempt runs
after it returns. Once ``stop`` began, leases are refused, so a task that
starts late returns without running.

The session itself (which SparkContext, its task slots, Spark's log level) is
:mod:`lockgate.cluster.spark.session`'s.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any

import cloudpickle

from lockgate.cluster.events import TaskEvent, TaskExited
from lockgate.cluster.spark.session import check_slots, is_local
from lockgate.cluster.spark.stage import BarrierStage, stage_of
from lockgate.errors import ConfigurationError
from lockgate.protocol import (
    Exited,
    Finishing,
    FinishingSeen,
    Hello,
    LeaseGranted,
    LeaseRefused,
)
from lockgate.runtime import handshake, wire
from lockgate.runtime.spec import TaskSpec
from lockgate.runtime.steps import Steps, mark

log = logging.getLogger("lockgate.driver")

STOP_TIMEOUT = 30.0
"""Seconds ``stop`` waits for the tasks of an attempt to be gone before it goes
on without them (they are fenced)."""


class SparkLauncher:
    """Runs the tasks of one attempt in the job's Spark barrier stage."""

    name = "spark"

    def __init__(self, events: queue.Queue[TaskEvent], sc: Any = None) -> None:
        self.events = events
        self._sc = sc
        self._lock = threading.Condition()
        self.attempt = -1
        self._tasks: list[int] = []
        self._leases: dict[int, _Lease] = {}
        """Every task that took a lease, by global task number (gone or not)."""
        self._reported: set[int] = set()
        """Tasks whose exit was reported without a lease (they never took one)."""
        self._stopping = False
        self._stalled = False
        self._stage: BarrierStage | None = None
        self._listener: socket.socket | None = None
        self._local = True
        self.reused_stage = False
        """Whether the attempt ran on the hosts of the stage before (a fork each)."""
        self.submitted_at: float | None = None
        self.steps: Steps = {}
        """The launcher's start-up steps (``submitted``, :mod:`lockgate.cluster.startup`)."""

    # ----------------------------------------------------------------- api
    def start(self, specs: list[TaskSpec], coordinator: tuple[str, int], secret: bytes) -> None:
        from pyspark import SparkContext

        sc = self._sc or SparkContext._active_spark_context
        if sc is None:
            raise ConfigurationError("the spark launcher found no running SparkContext; run "
                                     "the job with Pipeline.run(launcher='spark')")
        self._sc = sc
        n = len(specs)
        check_slots(sc, n)
        self._local = is_local(sc)
        self.attempt = specs[0].attempt
        self._tasks = [s.task_id for s in specs]
        self._job_id = specs[0].job_id
        self._secret = secret
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((coordinator[0], 0))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=handshake.serve_connections,
                         args=(listener, secret, "lease", self._serve_lease),
                         kwargs={"encrypt": specs[0].encrypt_traffic},
                         daemon=True, name="spark-leases").start()
        common = {
            "coordinator": list(coordinator), "secret": secret,
            "lease": list(listener.getsockname()[:2]),
            "host": "127.0.0.1" if self._local else None,
            # local mode: the driver's import path, so that user modules the
            # pickled functions refer to import in the workers too
            "sys_path": [p or os.getcwd() for p in sys.path] if self._local else [],
        }
        payloads = [pickle.dumps({**common, "spec": cloudpickle.dumps(s)}) for s in specs]
        self._stage = stage_of(self._job_id, secret, coordinator[0], specs[0].encrypt_traffic)
        self.submitted_at = time.monotonic()
        mark(self.steps, "submitted")
        self.reused_stage = self._stage.run(sc, self, payloads, self._local,
                                            specs[0].state_backend)

    def pids(self) -> dict[int, int]:
        """Process id of every running task (a child of its host), by global task number."""
        with self._lock:
            return {t: lease.pid for t, lease in self._leases.items() if not lease.gone}

    def host_pids(self) -> dict[int, int]:
        """Process id of every host of the job's stage (a Spark Python worker),
        by global task number of this attempt."""
        if self._stage is None:
            return {}
        return {self._tasks[slot]: pid for slot, pid in self._stage.host_pids().items()
                if slot < len(self._tasks)}

    def stalled(self) -> None:
        """The attempt did not start in time (a host or task never came up):
        ``stop`` cancels the stage, and the next attempt runs on a new one."""
        with self._lock:
            self._stalled = True

    def stop(self) -> None:
        """Make sure no task of the attempt runs any more: tasks that are
        ending by themselves (they sent ``finished``) may; the others are
        SIGKILLed (in local mode directly, else by their host; a host that
        cannot be reached is cancelled with its stage). Returns when every
        task that took a lease is gone."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            doomed = [t for t in self._tasks
                      if not (t in self._leases and self._leases[t].finishing)]
            live = [(t, lease) for t, lease in self._leases.items()
                    if t in doomed and not lease.gone]
        stage = self._stage
        if self._stalled and stage is not None:
            stage.abort()  # its hosts never all came up: the next attempt gets a new stage
        for t, lease in live:
            if self._local:
                try:
                    os.kill(lease.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            elif stage is not None and not stage.kill(self._tasks.index(t)):
                stage.abort()
        deadline = time.monotonic() + STOP_TIMEOUT
        with self._lock:
            while any(not lease.gone for lease in self._leases.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    # An executor the driver cannot reach: go on, the task is
                    # fenced (refused by the coordinator and by the next
                    # attempt's tasks; its sink cannot commit without a notice).
                    alive = sorted(t for t, lease in self._leases.items() if not lease.gone)
                    log.warning("tasks %s of attempt %d still hold their lease %.0f s after "
                                "they were killed; going on without them (they are fenced)",
                                alive, self.attempt, STOP_TIMEOUT)
                    break
                self._lock.wait(left)
        if self._listener is not None:
            handshake.close_listener(self._listener)

    # ----------------------------------------- the stage's news (Watcher)
    def task_ended(self, slot: int, code: int) -> None:
        """The host of ``slot`` reaped this attempt's child: a task that never
        took a lease (it failed before, or was refused one) is reported here."""
        self._never_leased(slot, code)

    def slot_lost(self, slot: int) -> None:
        """The host of ``slot`` is gone, and its child with it."""
        self._never_leased(slot, None)

    def _never_leased(self, slot: int, code: int | None) -> None:
        if slot >= len(self._tasks):
            return
        task = self._tasks[slot]
        with self._lock:
            if task in self._leases or task in self._reported:
                return  # the lease reports it
            self._reported.add(task)
        self.events.put(TaskExited(self.attempt, task, code))

    def _serve_lease(self, link: wire.Link, hello: Hello) -> None:
        channel = wire.ControlChannel(link)
        task = hello.task
        with self._lock:
            ok = (hello.role == "lease" and hello.job == self._job_id
                  and hello.attempt == self.attempt and task in self._tasks
                  and task not in self._leases and not self._stopping)
            if ok:
                lease = self._leases[task] = _Lease(hello.pid, hello.host)
        try:
            channel.send(LeaseGranted() if ok else LeaseRefused())
        except OSError:
            pass
        if not ok:
            channel.close()
            return
        code: int | None = None
        try:
            while True:
                match channel.recv():
                    case Finishing():
                        with self._lock:
                            lease.finishing = True
                        channel.send(FinishingSeen())
                    case Exited(exit_code):
                        code = exit_code
        except (OSError, EOFError, ValueError):
            pass
        channel.close()
        with self._lock:
            lease.gone = True
            self._lock.notify_all()
        # None: the process vanished without a word (killed, crashed).
        self.events.put(TaskExited(self.attempt, task, code))


class _Lease:
    __slots__ = ("pid", "host", "finishing", "gone")

    def __init__(self, pid: int, host: str) -> None:
        self.pid = pid
        self.host = host
        self.finishing = False
        self.gone = False
