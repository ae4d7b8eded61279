"""The Spark side of the ``spark`` launcher: a task *host* per task slot of the
job's barrier stage, and the task child it forks for each attempt.

A Spark barrier stage cannot be relaunched after one of its tasks died
(Spark aborts the job), and a new stage costs Spark's scheduling (most of a
second on a small machine). So a Spark task of Lockgate's stage does not run
a Lockgate task itself: it *hosts* them. :func:`host_partition` connects to
the driver's :class:`~lockgate.cluster.spark.stage.BarrierStage` and, for
every attempt, forks a child (:class:`~lockgate.protocol.RunTask`) that runs
the task exactly as before (:func:`run_leased`: its own lease, then
:func:`~lockgate.runtime.task.run_task`). A SIGKILLed task ends its child
only: the host reports it (:class:`~lockgate.protocol.TaskEnded`), and the
next attempt is another fork in the same Spark task, as with the local
launcher's fork server. Flink's TaskManagers keep their slots across a
failover the same way.

The host stays single-threaded (it forks), SIGKILLs its child on
:class:`~lockgate.protocol.KillTask`, and ends it before returning
(:class:`~lockgate.protocol.Release`: the job's end, or a rescale whose next
attempt needs a stage of another size; or the driver gone). A child dies with
its host (``PR_SET_PDEATHSIG``): when Spark kills the host's Python worker (a
cancelled stage, a lost executor), no task outlives it.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

import cloudpickle

from lockgate.protocol import (
    Exited,
    Finishing,
    Hello,
    KillTask,
    LeaseGranted,
    Release,
    RunTask,
    TaskEnded,
)
from lockgate.runtime import handshake, wire
from lockgate.runtime.spec import TaskSpec, process_name
from lockgate.runtime.steps import Steps, mark
from lockgate.runtime.task_main import die_with_parent, end_child

log = logging.getLogger("lockgate.task")

HOST_PROCESS_PREFIX = "lghost-"
"""What ``ps -o comm`` shows for a host: ``lghost-<generation>-<slot>``."""


def host_partition(payloads: Iterable[bytes]) -> Iterator[int]:
    """The barrier stage's partition function: one host per partition. Keeps
    nothing in module globals: the Python worker may serve another job next."""
    for payload in payloads:
        yield serve(pickle.loads(payload))


def serve(job: dict[str, Any]) -> int:
    """Host task slot ``job["slot"]`` of the stage until released; returns the slot."""
    for p in job["sys_path"]:
        if p not in sys.path:
            sys.path.append(p)
    slot: int = job["slot"]
    bind = job["host"] or executor_host()
    link = handshake.open_link(
        tuple(job["stage"]), job["secret"],
        Hello("host", job["job"], job["generation"], slot, os.getpid(), bind),
        encrypt=job["encrypt"])
    channel = wire.ControlChannel(link)
    if threading.active_count() > 1:  # pragma: no cover - PySpark's pipelined worker mode
        log.warning("the Spark task hosting slot %d runs %d threads: forking its task "
                    "children may deadlock", slot, threading.active_count())
    with process_name(f"{HOST_PROCESS_PREFIX}{job['generation']}-{slot}"[:15]):
        job_over = _loop(channel, link)
    if job_over:  # the job ended: its local copies on this machine go (local recovery)
        from lockgate.state.factory import remove_local_copies

        try:
            remove_local_copies(job.get("state_backend"), job["job"])
        except Exception:
            log.warning("could not delete the local copies of job %s", job["job"],
                        exc_info=True)
    return slot


def _loop(channel: wire.ControlChannel, link: wire.Link) -> bool:
    """Serve the driver's messages; True when released at the job's end,
    False when released for a stage of another size (a rescale) or when the
    driver went away."""
    child: _Child | None = None
    try:
        while True:
            watched: list[Any] = [link.sock]
            if child is not None:
                watched.append(child.pidfd)
            ready, _, _ = select.select(watched, [], [])
            if child is not None and child.pidfd in ready:
                channel.send(TaskEnded(child.attempt, child.reap()))
                child = None
            if link.sock not in ready:
                continue
            try:
                message = channel.recv()
            except (OSError, EOFError, ValueError):
                return False  # the driver is gone (or broke the protocol): end
            match message:
                case RunTask(attempt, payload):
                    if child is not None:  # stop() saw its lease close: it is ending
                        child.kill()
                        channel.send(TaskEnded(child.attempt, child.reap()))
                    child = _Child(attempt, payload, link)
                case KillTask():
                    if child is not None:
                        child.kill()
                case Release(job_over):
                    return job_over
    finally:
        if child is not None:
            child.kill()
            child.reap()
        channel.close()


class _Child:
    """One attempt's task, forked from the host."""

    def __init__(self, attempt: int, payload: bytes, link: wire.Link) -> None:
        self.attempt = attempt
        host = os.getpid()
        pid = os.fork()
        if pid == 0:
            _run_child(payload, host, link)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self._reaped = False

    def kill(self) -> None:
        if not self._reaped:  # not reaped: the pid is still ours, never a recycled one
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reap(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        self._reaped = True
        os.close(self.pidfd)
        return os.waitstatus_to_exitcode(status)


def _run_child(payload: bytes, host: int, link: wire.Link) -> None:
    """In the forked child: run the task, never return."""
    code = 1
    try:
        entry = time.time()
        die_with_parent(host)  # its Python worker killed by Spark
        os.close(link.sock.detach())  # the host's connection is the host's alone
        run_leased(pickle.loads(payload), {"entry": entry})
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        end_child(code)


# ------------------------------------------------------------ the task child
def run_leased(job: dict[str, Any], steps: Steps) -> int:
    """Run one Lockgate task under a lease from the launcher; its task number
    (-1: the attempt was stopped before it could start)."""
    for p in job["sys_path"]:
        if p not in sys.path:
            sys.path.append(p)
    from lockgate.runtime.task import run_task

    spec: TaskSpec = cloudpickle.loads(job["spec"])
    mark(steps, "imported")
    spec.bind_host = job["host"] or executor_host()
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
        # exit 1): no second report.
        log.debug("Lockgate task %d of attempt %d failed: %r", spec.task_id, spec.attempt, e)
    finally:
        try:
            lease.send(Exited(code))
        except OSError:
            pass
        lease.close()
    return spec.task_id


def executor_host() -> str:
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
    killing it. The launcher knows before the job master does."""
    try:
        lease.send(Finishing())
        lease.recv()
    except (OSError, EOFError, ValueError):
        pass
