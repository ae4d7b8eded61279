"""The driver's side of a job's long-lived Spark barrier stage: one *host*
per task slot (:mod:`lockgate.cluster.spark.host`), kept across attempts.

:meth:`BarrierStage.run` starts an attempt's tasks: on the hosts of the
running stage when every one of them is connected (one
:class:`~lockgate.protocol.RunTask` each: a fork on the executor, no Spark
scheduling), else on a new stage (a new *generation*: the old stage, if any,
ends first, and its hosts that connect late are refused). A whole old stage of
another size (a rescale) is released: its hosts return their Spark tasks and
the slots are free at once; one that lost a host is cancelled. Spark never
relaunches a barrier stage one of whose tasks died, so a lost host (its
executor or Python worker killed) costs a new stage; a lost task costs a
fork. :func:`release` ends the stage when the job is over.

One stage per job (:func:`stage_of`), shared by the job's per-attempt
:class:`~lockgate.cluster.spark.launcher.SparkLauncher` objects; the attempt
whose tasks run hears of each host's news through :class:`Watcher`.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import sys
import threading
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from lockgate.cluster.spark.naming import spark_description
from lockgate.protocol import Hello, KillTask, Release, RunTask, TaskEnded
from lockgate.runtime import handshake, wire

if TYPE_CHECKING:
    from lockgate.state.backends import StateBackend

log = logging.getLogger("lockgate.driver")

RELEASE_TIMEOUT = 10.0
"""Seconds a released stage's hosts have to return (the job's end, or a
rescale's new stage) before the stage is cancelled."""

ABORT_TIMEOUT = 30.0
"""Seconds a new stage waits for the cancelled one's Spark job to end."""


class Watcher(Protocol):
    """What the attempt whose tasks run on the stage hears."""

    attempt: int

    def task_ended(self, slot: int, code: int) -> None:
        """The child that ran slot ``slot``'s task of this attempt ended."""

    def slot_lost(self, slot: int) -> None:
        """Slot ``slot``'s host is gone (so is its child, if it had one)."""


class _Host:
    __slots__ = ("channel", "pid", "address", "alive")

    def __init__(self, channel: wire.ControlChannel, pid: int, address: str) -> None:
        self.channel = channel
        self.pid = pid
        self.address = address
        self.alive = True


class BarrierStage:
    """A job's barrier stage of task hosts (see the module's text)."""

    def __init__(self, job_id: str, secret: bytes, bind: str, encrypt: bool) -> None:
        self.job_id = job_id
        self._secret = secret
        self._encrypt = encrypt
        self._lock = threading.Condition()
        self._generation = -1
        self._slots = 0
        self._hosts: dict[int, _Host] = {}
        self._pending: dict[int, tuple[int, bytes]] = {}
        """Slot -> (attempt, payload) to send once the slot's host connects."""
        self._job: threading.Thread | None = None
        self._group = ""
        self._sc: Any = None
        self._watcher: Watcher | None = None
        self._closed = False
        self.generations = 0
        """How many stages (Spark jobs) this job submitted."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, 0))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=handshake.serve_connections,
                         args=(listener, secret, "host", self._serve_host),
                         kwargs={"encrypt": encrypt}, daemon=True,
                         name="spark-hosts").start()

    # ----------------------------------------------------------------- api
    def run(self, sc: Any, watcher: Watcher, payloads: list[bytes], local: bool,
            state_backend: StateBackend | None = None) -> bool:
        """Start one attempt's tasks (``payloads[i]`` on slot ``i``); True when
        the running stage's hosts took them, False when a new stage was submitted.
        ``state_backend``: the job's, whose local copies (local recovery) a
        host deletes on its machine when it is released at the job's end."""
        n = len(payloads)
        with self._lock:
            if self._closed:
                raise RuntimeError("the job's Spark stage was released")
            self._watcher = watcher
            reuse = (self._job is not None and self._job.is_alive() and self._slots == n
                     and len(self._hosts) == n and not self._pending
                     and all(h.alive for h in self._hosts.values()))
            if reuse:
                for slot, host in self._hosts.items():
                    self._send(slot, host, RunTask(watcher.attempt, payloads[slot]))
                return True
        self._retire()
        with self._lock:
            self._generation += 1
            self.generations += 1
            self._slots = n
            self._hosts = {}
            self._pending = {i: (watcher.attempt, p) for i, p in enumerate(payloads)}
            self._group = f"lockgate-{uuid.uuid4().hex}"
            self._sc = sc
            common = {
                "stage": list(self._listener.getsockname()[:2]), "secret": self._secret,
                "job": self.job_id, "generation": self._generation, "encrypt": self._encrypt,
                "host": "127.0.0.1" if local else None,
                # local mode: the driver's import path, so that user modules
                # the pickled functions refer to import in the workers too
                "sys_path": [p or os.getcwd() for p in sys.path] if local else [],
                "state_backend": state_backend,
            }
            jobs = [pickle.dumps({**common, "slot": i}) for i in range(n)]
            self._job = threading.Thread(
                target=self._run_stage, args=(sc, jobs, self._generation, watcher.attempt),
                daemon=True, name=f"spark-stage-{self._generation}")
            self._job.start()
        return False

    def kill(self, slot: int) -> bool:
        """SIGKILL the task child on ``slot`` (through its host); False when the
        host cannot be reached."""
        with self._lock:
            host = self._hosts.get(slot)
        if host is None or not host.alive:
            return False
        try:
            host.channel.send(KillTask())
        except OSError:
            return False
        return True

    def abort(self) -> None:
        """Cancel the stage (every host and its child end with their Spark task)."""
        self._abort()

    def host_pids(self) -> dict[int, int]:
        """Process id of every connected host (a Spark Python worker), by slot."""
        with self._lock:
            return {slot: h.pid for slot, h in self._hosts.items() if h.alive}

    def close(self) -> None:
        """The job is over: release every host (each ends its child and returns
        its Spark task), wait for the stage's Spark job to end, else cancel it."""
        with self._lock:
            self._closed = True
            hosts = list(self._hosts.values())
            job = self._job
        self._release(hosts, job, job_over=True)
        handshake.close_listener(self._listener)

    # ------------------------------------------------------------ internals
    def _send(self, slot: int, host: _Host, message: RunTask) -> None:
        try:
            host.channel.send(message)
        except OSError:
            host.alive = False  # its reader reports the loss

    def _retire(self) -> None:
        """Before a new stage: end the running one. Hosts that all run (a
        rescale: the next attempt needs a stage of another size) are released
        and return their Spark tasks, whose slots are then free at once; a
        cancelled stage keeps them up to ~2 s more (Spark's Python runner
        looks at a cancelled task every 2 s before it kills the worker). A
        stage whose hosts are not all there, or that does not end when
        released, is cancelled."""
        with self._lock:
            hosts = list(self._hosts.values())
            whole = (self._job is not None and self._job.is_alive() and not self._pending
                     and len(hosts) == self._slots and all(h.alive for h in hosts))
        if not whole:
            self._abort()
            return
        self._release(hosts, self._detach(), job_over=False)

    def _release(self, hosts: list[_Host], job: threading.Thread | None,
                 job_over: bool) -> None:
        """Release ``hosts`` (each ends its child and returns its Spark task) and
        wait for the stage's Spark job to end, else cancel it."""
        for host in hosts:
            try:
                host.channel.send(Release(job_over))
            except OSError:
                pass
        if job is None:
            return
        job.join(RELEASE_TIMEOUT)
        if job.is_alive():
            log.warning("the hosts of the job's Spark stage did not return %.0f s after "
                        "they were released; cancelling it", RELEASE_TIMEOUT)
            self._abort()

    def _detach(self) -> threading.Thread | None:
        """The running stage is no longer the job's: hosts of it connecting
        late are refused, and those connected are no longer the stage's
        (their end is no news). Returns its Spark job's thread."""
        with self._lock:
            job = self._job
            self._generation += 1
            self._hosts = {}
            self._pending = {}
        return job

    def _abort(self) -> None:
        with self._lock:
            group, sc = self._group, self._sc
        job = self._detach()
        if job is None or not job.is_alive():
            return
        try:
            sc.cancelJobGroup(group)
        except Exception as e:
            log.warning("cancelling Spark job group %s failed: %s", group, e)
        job.join(ABORT_TIMEOUT)
        if job.is_alive():
            log.warning("the job's cancelled Spark stage did not end within %.0f s; going on "
                        "(its tasks are fenced)", ABORT_TIMEOUT)

    def _run_stage(self, sc: Any, jobs: list[bytes], generation: int, attempt: int) -> None:
        from lockgate.cluster.spark.host import host_partition

        error: BaseException | None = None
        try:
            sc.setJobGroup(self._group, spark_description(self.job_id, attempt),
                           interruptOnCancel=True)
            sc.parallelize(jobs, len(jobs)).barrier().mapPartitions(host_partition).collect()
        except BaseException as e:
            error = e
        with self._lock:
            current = generation == self._generation
            if current:
                lost = [slot for slot in range(self._slots)
                        if slot not in self._hosts or self._hosts[slot].alive]
                for host in self._hosts.values():
                    host.alive = False
                self._pending = {}
            watcher = self._watcher
        if not current or watcher is None or self._closed:
            return
        if error is not None:
            log.warning("the job's Spark stage failed: %s", first_line(error))
        for slot in lost:
            watcher.slot_lost(slot)

    def _serve_host(self, link: wire.Link, hello: Hello) -> None:
        channel = wire.ControlChannel(link)
        slot = hello.task
        with self._lock:
            ok = (hello.role == "host" and hello.job == self.job_id and not self._closed
                  and hello.attempt == self._generation and 0 <= slot < self._slots
                  and slot not in self._hosts)
            if ok:
                host = self._hosts[slot] = _Host(channel, hello.pid, hello.host)
                pending = self._pending.pop(slot, None)
                if pending is not None:
                    self._send(slot, host, RunTask(*pending))
        if not ok:
            channel.close()
            return
        try:
            while True:
                message = channel.recv()
                if isinstance(message, TaskEnded):
                    with self._lock:
                        watcher = self._watcher
                    if watcher is not None and watcher.attempt == message.attempt:
                        watcher.task_ended(slot, message.code)
        except (OSError, EOFError, ValueError):
            pass
        channel.close()
        with self._lock:
            mine = self._hosts.get(slot) is host and host.alive
            host.alive = False
            watcher = self._watcher
        if mine and watcher is not None:
            watcher.slot_lost(slot)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return text.splitlines()[0][:500] if text else type(error).__name__


# ------------------------------------------------------------ one per job
_STAGES: dict[str, BarrierStage] = {}
_STAGES_LOCK = threading.Lock()


def stage_of(job_id: str, secret: bytes, bind: str, encrypt: bool) -> BarrierStage:
    """The job's stage (created on its first attempt)."""
    with _STAGES_LOCK:
        stage = _STAGES.get(job_id)
        if stage is None:
            stage = _STAGES[job_id] = BarrierStage(job_id, secret, bind, encrypt)
        return stage


def release(job_id: str) -> None:
    """The job is over: end its stage, if it has one."""
    with _STAGES_LOCK:
        stage = _STAGES.pop(job_id, None)
    if stage is not None:
        stage.close()
