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
completed checkpoint with a new Spark job (cheap on a warm session).
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

from lockgate.cluster.java import ensure_java
from lockgate.cluster.server import Event
from lockgate.errors import ConfigurationError
from lockgate.runtime import wire
from lockgate.runtime.task import Task, TaskSpec, process_name, task_process_name

log = logging.getLogger("lockgate.driver")

SESSION_CONF = {
    # a cancelled task's Python worker is killed 100 ms after the interrupt
    # (default 2 s): the zombies of a failed attempt go away sooner
    "spark.python.task.killTimeout": "100ms",
    # a streaming job's stage never ends: no progress bar on the console
    "spark.ui.showConsoleProgress": "false",
    # the web UI listens on every interface without authentication: off in the
    # sessions Lockgate starts (pass your own session to have it)
    "spark.ui.enabled": "false",
}
OWNED = "spark.lockgate.ownedSession"
"""Set on a SparkSession Lockgate created itself: it may stop and recreate it."""
STOP_TIMEOUT = 30.0
"""Seconds ``stop`` waits for the tasks of an attempt to be gone before it goes
on without them (they are fenced)."""


# ---------------------------------------------------------------- driver side
def prepare_spark(spark: Any = None, master: str | None = None,
                  num_tasks: int = 1) -> str:
    """Make sure a SparkContext that can run ``num_tasks`` barrier tasks is
    running, and return the host the driver's listeners bind (127.0.0.1 in
    local mode, ``spark.driver.host`` on a cluster).

    ``spark``: the user's SparkSession (or SparkContext), or ``None`` for the
    running one, or a new one on ``master`` (default ``local[num_tasks]``).
    """
    sc = spark_context(spark, master, num_tasks)
    check_slots(sc, num_tasks)
    if is_local(sc):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host") or socket.gethostname()


def spark_context(spark: Any, master: str | None, num_tasks: int) -> Any:
    """The SparkContext a job runs on (classic PySpark: one per process)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if spark is not None:
        if isinstance(spark, SparkContext):
            sc = spark
        else:
            try:
                sc = spark.sparkContext
            except Exception as e:  # noqa: BLE001 - Spark Connect has no SparkContext
                raise ConfigurationError(
                    "the spark launcher needs a classic SparkSession with a SparkContext "
                    f"(Spark Connect sessions cannot run barrier stages): {e}") from None
        if master is not None and sc.master != master:
            raise ConfigurationError(
                f"the SparkSession passed runs on master {sc.master!r}, not {master!r}; "
                "pass either a session or a master")
        return sc
    sc = SparkContext._active_spark_context
    stopped_own = False
    if sc is not None:
        owned = sc.getConf().get(OWNED) == "true"
        if master is None and (not owned or task_slots(sc) >= num_tasks):
            return sc
        if master is not None and sc.master == master:
            return sc
        if not owned:
            raise ConfigurationError(
                f"a SparkContext on master {sc.master!r} is already running in this process, "
                f"so Lockgate cannot start one on {master!r}: pass spark=<that session>, or "
                "stop it first")
        log.info("stopping Lockgate's SparkSession on %s to start one on %s", sc.master,
                 master or default_master(num_tasks))
        SparkSession.builder.getOrCreate().stop()
        stopped_own = True
    # The workers must run this interpreter, or they cannot import Lockgate.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    ensure_java()
    quiet_spark_logs()
    builder = SparkSession.builder.appName("lockgate")
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ and not stopped_own:
        pass  # under spark-submit (its JVM started this process): its --master
    else:
        master = master or default_master(num_tasks)
        builder = builder.master(master)
        if master.startswith("local") and "SPARK_LOCAL_IP" not in os.environ:
            # a local session listens on loopback only (and Spark stops
            # guessing a public interface)
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    for key, value in {**SESSION_CONF, OWNED: "true"}.items():
        builder = builder.config(key, value)
    sc = builder.getOrCreate().sparkContext
    sc.setLogLevel(spark_log_level())
    return sc


def spark_log_level() -> str:
    """The level of Spark's own log lines: ``LOCKGATE_SPARK_LOG_LEVEL``, else
    OFF (``lockgate -v`` sets WARN)."""
    return os.environ.get("LOCKGATE_SPARK_LOG_LEVEL", "OFF").upper()


def quiet_spark_logs() -> None:
    """Before the JVM of a session Lockgate starts: Spark's log lines at
    :func:`spark_log_level` from the first one on (its banner too), through
    a log4j2 file of the package. A user's own ``PYSPARK_SUBMIT_ARGS`` or
    ``spark-submit`` (which started the JVM already) are left alone."""
    if "PYSPARK_SUBMIT_ARGS" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    config = os.path.join(os.path.dirname(__file__), "log4j2-quiet.properties")
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options '-Dlog4j2.configurationFile=file:{config} "
        f"-Dlockgate.spark.level={spark_log_level()}' pyspark-shell")


def default_master(num_tasks: int) -> str:
    """``local[N]``: a slot for every task of the job (slots need not be cores)
    and at least one per core, for the rest of the user's Spark work."""
    return f"local[{max(num_tasks, os.cpu_count() or 1)}]"


def is_local(sc: Any) -> bool:
    """Every executor runs on this machine (``local[...]``, ``local-cluster[...]``)."""
    return str(sc.master).startswith("local")


def task_slots(sc: Any) -> int:
    """How many tasks the application can run at once: what a barrier stage needs."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - a private Spark API: fall back to the public one
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        return sc.defaultParallelism // max(cpus, 1)


def check_slots(sc: Any, num_tasks: int) -> None:
    """Fail fast, instead of Spark's ~10 minutes of retries, when the barrier
    stage cannot get ``num_tasks`` slots at once."""
    conf = sc.getConf()
    if not is_local(sc) and conf.get("spark.dynamicAllocation.enabled", "false") == "true":
        raise ConfigurationError(
            "Spark barrier stages do not run with dynamic allocation: set "
            "spark.dynamicAllocation.enabled=false and a fixed number of executors "
            f"with at least {num_tasks} task slots in all")
    slots = task_slots(sc)
    if slots < num_tasks and not is_local(sc):
        # Executors of a cluster register after the session starts: give them
        # the time Spark gives them before its first job (no event to await).
        wait = _seconds(conf.get("spark.scheduler.maxRegisteredResourcesWaitingTime", "30s"))
        deadline = time.monotonic() + wait
        while slots < num_tasks and time.monotonic() < deadline:
            time.sleep(0.5)
            slots = task_slots(sc)
    if slots < num_tasks:
        raise ConfigurationError(
            f"the job has {num_tasks} tasks and runs them as one Spark barrier stage, which "
            f"needs {num_tasks} task slots at once, but the Spark application "
            f"(master {sc.master}) has {slots}. In local mode run with master "
            f"'local[{num_tasks}]' or more (slots need not match cores), e.g. "
            + ("spark-submit --master "
               f"'local[{num_tasks}]' (or lockgate run --master 'local[{num_tasks}]')"
               if "PYSPARK_GATEWAY_PORT" in os.environ else
               f"lockgate run --master 'local[{num_tasks}]' or "
               f"Pipeline.run(launcher='spark', master='local[{num_tasks}]')")
            + "; on a cluster give "
            f"the application at least {num_tasks} slots (executors x spark.executor.cores / "
            "spark.task.cpus, e.g. --num-executors and --executor-cores), or lower the job's "
            "parallelism")


def _seconds(value: str) -> float:
    value = value.strip().lower()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("min", 60.0), ("m", 60.0), ("h", 3600.0)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


class SparkLauncher:
    """Runs the tasks of one attempt as one Spark barrier stage."""

    name = "spark"

    def __init__(self, events: queue.Queue[Event], sc: Any = None) -> None:
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
        listener.listen(max(n, 16))
        self._listener = listener
        threading.Thread(target=wire.serve_connections,
                         args=(listener, secret, "lease", self._serve_lease),
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
        every task that took a lease is gone and the Spark job ended."""
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
        if job is not None:
            # Every task is gone or never ran: the Spark job ends now; cancel
            # it again if it does not (a task that never got a slot).
            job.join(5.0)
            while job.is_alive() and time.monotonic() < deadline:
                self._cancel()
                job.join(1.0)
            if job.is_alive():
                log.warning("the Spark job of attempt %d did not end after it was cancelled; "
                            "going on (its tasks are fenced)", self._attempt)
        if self._listener is not None:
            self._listener.close()

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
            sc.setJobGroup(self._group, f"Lockgate job {self._job_id} attempt {self._attempt}",
                           interruptOnCancel=True)
            with self._lock:
                stopped = self._stopping
            if not stopped:
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
            self.events.put(Event("exited", self._attempt, t,
                                  exit_code=1 if error is not None else 0))

    def _serve_lease(self, sock: socket.socket, reader: Any, hello: dict[str, Any]) -> None:
        channel = wire.ControlChannel(sock, reader)
        task = hello.get("task")
        with self._lock:
            ok = (hello.get("role") == "lease" and hello.get("job") == self._job_id
                  and hello.get("attempt") == self._attempt and task in self._tasks
                  and task not in self._leases and not self._stopping)
            if ok:
                lease = self._leases[task] = _Lease(int(hello["pid"]), str(hello["host"]))
        try:
            channel.send({"t": "ok" if ok else "refused"})
        except OSError:
            pass
        if not ok:
            channel.close()
            return
        code: int | None = None
        try:
            while True:
                msg = channel.recv()
                if msg.get("t") == "finishing":
                    with self._lock:
                        lease.finishing = True
                    channel.send({"t": "ack"})
                elif msg.get("t") == "exit":
                    code = int(msg["code"])
        except (OSError, EOFError, ValueError):
            pass
        channel.close()
        with self._lock:
            lease.gone = True
            self._lock.notify_all()
        # None: the process vanished without a word (killed, crashed).
        self.events.put(Event("exited", self._attempt, task, exit_code=code))


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
        yield _run_leased(pickle.loads(payload))


def _run_leased(job: dict[str, Any]) -> int:
    for p in job["sys_path"]:
        if p not in sys.path:
            sys.path.append(p)
    spec: TaskSpec = cloudpickle.loads(job["spec"])
    spec.bind_host = job["host"] or _executor_host()
    secret: bytes = job["secret"]
    lease = _take_lease(tuple(job["lease"]), secret, spec)
    if lease is None:
        return -1  # the attempt was stopped before this task could start
    code = 1
    try:
        with process_name(task_process_name(spec)):
            _LeasedTask(spec, tuple(job["coordinator"]), secret, lease).run()
        code = 0
    except Exception as e:
        # The driver already knows (the task reported it, or its lease says
        # exit 1): the Spark task returns instead of raising, so that Spark does
        # not log a stack trace for every task of a failed attempt.
        log.debug("Lockgate task %d of attempt %d failed: %r", spec.task_id, spec.attempt, e)
    finally:
        try:
            lease.send({"t": "exit", "code": code})
        except OSError:
            pass
        lease.close()
    return spec.task_id


def _executor_host() -> str:
    """The address Spark reaches this executor on: peers and the driver can too."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    address = ctx.getTaskInfos()[ctx.partitionId()].address
    return address.rsplit(":", 1)[0]


def _take_lease(address: tuple[str, int], secret: bytes,
                spec: TaskSpec) -> wire.ControlChannel | None:
    sock = wire.connect(address)
    reader = sock.makefile("rb", buffering=0)
    wire.authenticate_client(sock, reader, secret, {
        "role": "lease", "job": spec.job_id, "attempt": spec.attempt, "task": spec.task_id,
        "pid": os.getpid(), "host": spec.bind_host,
    })
    channel = wire.ControlChannel(sock, reader)
    try:
        answer = channel.recv()
    except (OSError, EOFError):
        answer = {}
    if answer.get("t") != "ok":
        channel.close()
        return None
    return channel


class _LeasedTask(Task):
    """``run_task``'s Task, which also tells the launcher when it sent
    ``finished`` (just before): from then on it ends by itself, and ``stop`` lets it end
    instead of killing it (a killed worker would fail the Spark job and be
    forked anew for the next one)."""

    def __init__(self, spec: TaskSpec, coordinator: tuple[str, int], secret: bytes,
                 lease: wire.ControlChannel) -> None:
        super().__init__(spec, coordinator, secret)
        self._lease = lease

    def _send(self, msg: dict[str, Any]) -> None:
        if msg.get("t") == "finished":
            # The launcher knows before the job master does (acknowledged).
            try:
                self._lease.send({"t": "finishing"})
                self._lease.recv()
            except (OSError, EOFError):
                pass
        super()._send(msg)
