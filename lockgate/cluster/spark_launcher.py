"""The ``spark`` launcher: every task of an attempt is one task of a single
Spark barrier stage.

``start`` submits ``sc.parallelize(payloads, n).barrier().mapPartitions(...)``
from a background thread of the driver (under a job group of its own), so
Spark gang-schedules the ``n`` tasks: all start together or none. Each Spark
task runs one Lockgate task in its Python worker with the same entry point as
the local launcher (``TaskSpec``, coordinator address, secret).

Before it runs anything, a Spark task takes a *lease* from this launcher: one
authenticated TCP connection to a listener the launcher opens next to the
control server, with the task's pid and host. The lease is how the launcher
knows which tasks of its attempt exist and when each is gone (the connection
closes when the task returns or its process dies), so ``stop`` can guarantee
what the local launcher guarantees with ``wait()``: no task of the attempt runs
after it returns. Once ``stop`` began, leases are refused, so a Spark task that
starts late (after the cancel) returns without running.

Spark never retries a barrier result stage: one dead task aborts the Spark
job, and Lockgate's job master restarts the whole attempt from the latest
completed checkpoint with a new Spark job (cheap on a warm session). The
session itself (which SparkContext, its task slots, Spark's log level) is
:mod:`lockgate.cluster.spark_session`'s.
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
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import cloudpickle

from lockgate.cluster.events import TaskEvent, TaskExited
from lockgate.cluster.naming import spark_description
from lockgate.cluster.spark_session import check_slots, is_local
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
    """Runs the tasks of one attempt as one Spark barrier stage."""

    name = "spark"

    def __init__(self, events: queue.Queue[TaskEvent], sc: Any = None) -> None:
        self.events = events
        self._sc = sc
        self._lock = threading.Condition()
        self._attempt = -1
        self._tasks: list[int] = []
        self._leases: dict[int, _Lease] = {}
        """Every task that took a lease, by global task number (gone or not)."""
        self._stopping = False
        self._job: threading.Thread | None = None
        self._job_error: BaseException | None = None
        self._group = f"lockgate-{uuid.uuid4().hex}"
        self._listener: socket.socket | None = None
        self._local = True
        self._cancelled = False
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
        self._attempt = specs[0].attempt
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
        self._job = threading.Thread(target=self._run_job, args=(sc, payloads), daemon=True,
                                     name=f"spark-job-{self._attempt}")
        self.submitted_at = time.monotonic()
        self._job.start()

    def pids(self) -> dict[int, int]:
        """Process id of every running task (its Python worker), by global task number."""
        with self._lock:
            return {t: lease.pid for t, lease in self._leases.items() if not lease.gone}

    def stop(self) -> None:
        """Make sure no task of the attempt runs any more: tasks that are
        ending by themselves (they sent ``finished``) may; the others are
        cancelled through Spark (and SIGKILLed in local mode). Returns when
        every task that took a lease is gone, and, unless tasks were
        cancelled, the Spark job ended (a cancelled one ends in the background)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            doomed = [t for t in self._tasks
                      if not (t in self._leases and self._leases[t].finishing)]
            live = [lease for t, lease in self._leases.items()
                    if t in doomed and not lease.gone]
        job = self._job
        if doomed and job is not None and job.is_alive():
            self._cancel()
        if self._local:
            for lease in live:
                try:
                    os.kill(lease.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
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
                                "they were cancelled; going on without them (they are fenced)",
                                alive, self._attempt, STOP_TIMEOUT)
                    break
                self._lock.wait(left)
        if job is not None and doomed:
            # Every task is gone or never ran (and a late one is refused its
            # lease): the next attempt may start while Spark winds this job
            # down, which takes a round trip through the JVM and its error.
            threading.Thread(target=self._end_job, args=(job, deadline), daemon=True,
                             name=f"spark-job-{self._attempt}-end").start()
        elif job is not None:
            self._end_job(job, deadline)
        if self._listener is not None:
            handshake.close_listener(self._listener)

    def _end_job(self, job: threading.Thread, deadline: float) -> None:
        """Every task is gone or never ran: the Spark job ends now; cancel it
        again if it does not (a task that never got a slot)."""
        job.join(5.0)
        while job.is_alive() and time.monotonic() < deadline:
            self._cancel()
            job.join(1.0)
        if job.is_alive():
            log.warning("the Spark job of attempt %d did not end after it was cancelled; "
                        "going on (its tasks are fenced)", self._attempt)

    # ------------------------------------------------------------ internals
    def _cancel(self) -> None:
        self._cancelled = True
        try:
            assert self._sc is not None
            self._sc.cancelJobGroup(self._group)
        except Exception as e:  # noqa: BLE001 - a stopped SparkContext: nothing runs
            log.warning("cancelling Spark job group %s failed: %s", self._group, e)

    def _run_job(self, sc: Any, payloads: list[bytes]) -> None:
        n = len(payloads)
        error: BaseException | None = None
        try:
            sc.setJobGroup(self._group, spark_description(self._job_id, self._attempt),
                           interruptOnCancel=True)
            with self._lock:
                stopped = self._stopping
            if not stopped:
                mark(self.steps, "submitted")
                sc.parallelize(payloads, n).barrier().mapPartitions(_task_partition).collect()
        except BaseException as e:  # noqa: BLE001 - reported as task exits below
            error = e
        self._job_error = error
        with self._lock:
            never_ran = [t for t in self._tasks if t not in self._leases]
            stopping = self._stopping
        if error is not None and not stopping:
            log.warning("the Spark job of attempt %d failed: %s", self._attempt,
                        _first_line(error))
        for t in never_ran:
            self.events.put(TaskExited(self._attempt, t, 1 if error is not None else 0))

    def _serve_lease(self, link: wire.Link, hello: Hello) -> None:
        channel = wire.ControlChannel(link)
        task = hello.task
        with self._lock:
            ok = (hello.role == "lease" and hello.job == self._job_id
                  and hello.attempt == self._attempt and task in self._tasks
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
        self.events.put(TaskExited(self._attempt, task, code))


class _Lease:
    __slots__ = ("pid", "host", "finishing", "gone")

    def __init__(self, pid: int, host: str) -> None:
        self.pid = pid
        self.host = host
        self.finishing = False
        self.gone = False


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return text.splitlines()[0][:500] if text else type(error).__name__


# --------------------------------------------------------- Spark task side
def _task_partition(payloads: Iterable[bytes]) -> Iterator[int]:
    """Runs in a Spark Python worker: one Lockgate task per partition. Keeps
    nothing in module globals: the worker may be reused by the next job."""
    for payload in payloads:
        steps = {"entry": time.time()}
        yield _run_leased(pickle.loads(payload), steps)


def _run_leased(job: dict[str, Any], steps: Steps) -> int:
    for p in job["sys_path"]:
        if p not in sys.path:
            sys.path.append(p)
    from lockgate.runtime.task import run_task

    spec: TaskSpec = cloudpickle.loads(job["spec"])
    mark(steps, "imported")
    spec.bind_host = job["host"] or _executor_host()
    secret: bytes = job["secret"]
    lease = _take_lease(tuple(job["lease"]), secret, spec)
    if lease is None:
        return -1  # the attempt was stopped before this task could start
    mark(steps, "leased")
    code = 1
    try:
        run_task(spec, tuple(job["coordinator"]), secret, lambda: _finishing(lease), steps)
        code = 0
    except Exception as e:
        # The driver already knows (the task reported it, or its lease says
        # exit 1): the Spark task returns instead of raising, so that Spark does
        # not log a stack trace for every task of a failed attempt.
        log.debug("Lockgate task %d of attempt %d failed: %r", spec.task_id, spec.attempt, e)
    finally:
        try:
            lease.send(Exited(code))
        except OSError:
            pass
        lease.close()
    return spec.task_id


def _executor_host() -> str:
    """The address Spark reaches this executor on: peers and the driver can too."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    address = str(ctx.getTaskInfos()[ctx.partitionId()].address)
    return address.rsplit(":", 1)[0]


def _take_lease(address: tuple[str, int], secret: bytes,
                spec: TaskSpec) -> wire.ControlChannel | None:
    channel = wire.ControlChannel(handshake.open_link(address, secret, Hello(
        "lease", spec.job_id, spec.attempt, spec.task_id, os.getpid(), spec.bind_host),
        encrypt=spec.encrypt_traffic))
    try:
        answer = channel.recv()
    except (OSError, EOFError, ValueError):
        answer = None
    if not isinstance(answer, LeaseGranted):
        channel.close()
        return None
    return channel


def _finishing(lease: wire.ControlChannel) -> None:
    """Just before the task says ``finished``: tell the launcher (and wait for
    its answer), so that from then on ``stop`` lets the task end instead of
    killing it (a killed worker would fail the Spark job and be forked anew
    for the next one). The launcher knows before the job master does."""
    try:
        lease.send(Finishing())
        lease.recv()
    except (OSError, EOFError, ValueError):
        pass
