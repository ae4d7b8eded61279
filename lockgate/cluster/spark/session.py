"""The Spark session a job runs on: which SparkContext (the user's, the
running one, or one Lockgate starts), whether it has the task slots a barrier
stage needs, and how quiet Spark's own log lines are.

:func:`prepare_spark` is what the driver calls before a job on the ``spark``
launcher starts (:mod:`lockgate.cluster.spark.launcher` runs its tasks);
:func:`check_slots` is called again for every attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any

from lockgate.cluster import interrupt
from lockgate.cluster.spark import gateway as spark_gateway
from lockgate.cluster.spark import warm as spark_warm
from lockgate.cluster.spark.java import ensure_java, session_java_options
from lockgate.errors import ConfigurationError

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
    # Spark's Python daemon with Lockgate's task code imported before it forks
    # a worker: a task (and a restarted one) starts without a second of imports
    "spark.python.daemon.module": "lockgate.cluster.spark.daemon",
    # a worker whose task returned serves the next task (Spark's default, said)
    "spark.python.worker.reuse": "true",
}
LOG_LEVEL = "spark.log.level"
"""Spark's own setting of its log level: under ``spark-submit``, a user who
sets it (``--conf spark.log.level=INFO``) keeps it."""
OWNED = "spark.lockgate.ownedSession"
"""Set on a SparkSession Lockgate created itself: it may stop and recreate it."""


def prepare_spark(spark: Any = None, master: str | None = None,
                  num_tasks: int = 1, name: str = "lockgate", size: int = 0) -> str:
    """Make sure a SparkContext that can run ``num_tasks`` barrier tasks is
    running, and return the host the driver's listeners bind (127.0.0.1 in
    local mode, ``spark.driver.host`` on a cluster).

    ``spark``: the user's SparkSession (or SparkContext), or ``None`` for the
    running one, or a new one on ``master`` (default ``local[N]``, N the
    larger of ``num_tasks`` and ``size``: the tasks the autoscaler may run).
    """
    sc = spark_context(spark, master, max(num_tasks, size), name)
    check_slots(sc, num_tasks)
    if is_local(sc):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host") or socket.gethostname()


def spark_context(spark: Any, master: str | None, num_tasks: int,
                  name: str = "lockgate") -> Any:
    """The SparkContext a job runs on (classic PySpark: one per process); one
    Lockgate starts is the application ``name``.

    Lockgate starts a plain SparkContext, not a SparkSession: the session's
    builder loads Spark SQL eagerly (about 1.8 s of a cold start). A
    DataFrame user gets a session on the same context with
    ``SparkSession.builder.getOrCreate()`` (or ``SparkSession(sc)``)."""
    from pyspark import SparkContext

    if spark is not None:
        if isinstance(spark, SparkContext):
            sc = spark
        else:
            try:
                sc = spark.sparkContext
            except Exception as e:
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
        _stop(sc)
        stopped_own = True
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ and not stopped_own:
        # under spark-submit (its JVM started this process): its --master
        settings, java = _session_settings(None, name)
        SparkContext._ensure_initialized()  # connects to spark-submit's JVM
        conf = _spark_conf(settings)  # (with spark-submit's --conf)
        quiet = quiet_submitted_jvm(conf)
        sc = SparkContext.getOrCreate(conf)
        if quiet:
            sc.setLogLevel(spark_log_level())
        return sc
    master = master or default_master(num_tasks)
    early = _early.pop(master, None) if not stopped_own else None
    cancel_prestart()  # another master's (none: prestart and this agree)
    if early is not None and early.name == name:
        settings, java, learned, started = \
            early.settings, early.java, early.learned, early.started
    else:
        if early is not None:
            early.cancel()
        settings, java = _session_settings(master, name)
        learned = spark_gateway.cache_file(java) if is_local_master(master) else None
        started = spark_gateway.spawn(settings, learned)
    conf = _spark_conf(settings)
    if not is_local_master(master):
        sc = SparkContext.getOrCreate(conf)
    else:  # the JVM from the command learned from the first session (no launcher JVM)
        before = dict(os.environ)
        gateway = spark_gateway.connect(started) if started is not None else None
        if gateway is not None:
            spark_gateway.warm_up(gateway)  # beside the context's start
        sc = SparkContext(conf=conf, gateway=gateway)
        if gateway is None:
            spark_gateway.learn(SparkContext._gateway, dict(conf.getAll()), learned, before)
    interrupt.reassert()  # the context's SIGINT handler raises anywhere: ours again
    sc.setLogLevel(spark_log_level())
    return sc


def _session_settings(master: str | None, name: str) -> tuple[dict[str, str], str]:
    """The settings of a session Lockgate starts (its SparkConf's, in order),
    and the ``java`` it runs; a local one's warm Spark daemon is started.
    PySpark is not imported here: a local session's JVM starts first."""
    # The workers must run this interpreter, or they cannot import Lockgate.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    conf = {"spark.app.name": name}
    settings = {**SESSION_CONF, OWNED: "true"}
    if master is not None:
        conf["spark.master"] = master
        if is_local_master(master):
            # Spark's daemon runs on this machine: its imports overlap the JVM's start
            settings.update(spark_warm.start())
            if "SPARK_LOCAL_IP" not in os.environ:
                # a local session listens on loopback only (and Spark stops
                # guessing a public interface)
                os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    java = ensure_java()
    quiet_spark_logs(java)
    conf.update(settings)
    return conf, java


def _spark_conf(settings: dict[str, str]) -> Any:
    """The SparkConf of :func:`_session_settings`."""
    from pyspark import SparkConf

    conf = SparkConf()
    for key, value in settings.items():
        conf.set(key, value)
    return conf


class _Early:
    """A local session started ahead of the job's checks (:func:`prestart`)."""

    def __init__(self, name: str, settings: dict[str, str], java: str, learned: Any,
                 started: Any) -> None:
        self.name, self.settings, self.java, self.learned, self.started = \
            name, settings, java, learned, started

    def cancel(self) -> None:
        if self.started is not None:
            self.started.abandon()
        spark_warm.stop(self.settings)


_early: dict[str, _Early] = {}
"""The session :func:`prestart` began, by master (one at most)."""


def prestart(spark: Any, master: str | None, num_tasks: int, name: str) -> None:
    """Begin the local session a job will start (its warm daemon, and its
    JVM from a learned command) before the job's checks, so that they
    overlap the JVM's start; :func:`spark_context` goes on with it, and
    :func:`cancel_prestart` ends it if the job is refused. Nothing when the
    job would not start a session (one passed or running, spark-submit, a
    cluster master), or when this one began already (:func:`prestart_job`).
    PySpark is imported after the JVM started (its import is a tenth of a
    second or more of a cold start)."""
    if spark is not None or _running_jvm() or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    master = master or default_master(num_tasks)
    if not is_local_master(master):
        return
    if master in _early and _early[master].name == name:
        return  # begun by prestart_job
    cancel_prestart()
    settings, java = _session_settings(master, name)
    learned = spark_gateway.cache_file(java)
    _early[master] = _Early(name, settings, java, learned,
                            spark_gateway.spawn(settings, learned))


def prestart_job(pipeline: Any, spark: Any, master: str | None) -> None:
    """``Pipeline.run``/``start`` on the ``spark`` launcher: :func:`prestart`
    before the driver imports the job master's modules (a tenth of a second
    or more). Never raises: a job that cannot start is refused in order
    later (and :func:`cancel_prestart` ends this)."""
    if spark is not None:
        return
    try:
        from lockgate.cluster.autoscaler import tasks_at_most
        from lockgate.cluster.spark.naming import app_name
        from lockgate.graph.jobgraph import build_job_graph

        prestart(spark, master, tasks_at_most(build_job_graph(pipeline), pipeline.autoscale),
                 app_name(pipeline.name))
    except Exception as e:
        log.debug("no early Spark session: %s", e)
        cancel_prestart()


def _running_jvm() -> bool:
    """Whether this process has PySpark's JVM (a context runs, or ran):
    none before PySpark is imported, which this does not do."""
    module = sys.modules.get("pyspark")
    if module is None:
        return False
    context = module.SparkContext
    return context._active_spark_context is not None or context._gateway is not None


def kill_processes() -> None:
    """A second Ctrl-C (:func:`lockgate.cluster.interrupt.at_kill`): SIGKILL
    what this process started for Spark, each with the processes below it:
    the driver's JVM (PySpark's gateway, or one :func:`prestart` began; the
    local cluster's executors are in it, Spark's Python daemon below it),
    the warm daemon (Spark's daemon by now, with its workers and the task
    processes they forked) and a class-data archive build. Without this the
    JVM ends only when it reads the end of its stdin and Spark's shutdown
    hooks have run (seconds; never if it is frozen), and the build runs on
    in a session of its own. Under ``spark-submit`` the JVM is this
    process's parent, and ends with it."""
    procs: list[Any] = [early.started.proc for early in list(_early.values())
                        if early.started is not None]
    module = sys.modules.get("pyspark")
    gateway = module.SparkContext._gateway if module is not None else None
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    if proc is not None:
        procs.append(proc)
    procs += list(spark_warm.started())
    cds = sys.modules.get("lockgate.cluster.spark.cds")
    if cds is not None and cds.builder() is not None:
        procs.append(cds.builder())
    for proc in procs:
        try:
            if proc.poll() is None:  # (not reaped: its pid is still its own)
                interrupt.kill_tree(proc.pid)
        except Exception:
            pass


interrupt.at_kill(kill_processes)


def cancel_prestart() -> None:
    """End a session :func:`prestart` began and nobody took."""
    for early in list(_early.values()):
        early.cancel()
    _early.clear()


def _stop(sc: Any) -> None:
    """Stop Lockgate's own context, and the SparkSession a user made on it."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if session is not None and session.sparkContext is sc:
        session.stop()
    else:
        sc.stop()


def spark_log_level() -> str:
    """The level of Spark's own log lines: ``LOCKGATE_SPARK_LOG_LEVEL``, else
    OFF (``lockgate -v`` sets WARN)."""
    return os.environ.get("LOCKGATE_SPARK_LOG_LEVEL", "OFF").upper()


def quiet_spark_logs(java: str | None = None) -> None:
    """Before the JVM of a session Lockgate starts: Spark's log lines at
    :func:`spark_log_level` from the first one on (its banner too), through
    a log4j2 file of the package, :func:`session_java_options`, and the
    class-data archive of ``java`` when there is one
    (:mod:`lockgate.cluster.spark.cds`). A user's own
    ``PYSPARK_SUBMIT_ARGS`` or ``spark-submit`` (which started the JVM
    already) are left alone."""
    if "PYSPARK_SUBMIT_ARGS" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    config = os.path.join(os.path.dirname(__file__), "log4j2-quiet.properties")
    options = session_java_options()
    if java is not None:
        from lockgate.cluster.spark.cds import java_options

        archive = java_options(java, options)
        options = f"{options} {archive}" if archive else options
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options '-Dlog4j2.configurationFile=file:{config} "
        f"-Dlockgate.spark.level={spark_log_level()} {options}' pyspark-shell")


def quiet_submitted_jvm(conf: Any) -> bool:
    """Under ``spark-submit``, before the SparkContext starts: Spark's log
    lines at :func:`spark_log_level`, as in a session Lockgate starts,
    unless the user chose (``--conf spark.log.level=...``, or a log4j2 file
    of their own). ``spark-submit`` hands the application a JVM whose
    logging it reset, so the context's first line would load Spark's
    default configuration (INFO); it is loaded here without its banner and
    set to the level. Returns whether it was."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if conf.get(LOG_LEVEL) is not None \
            or jvm.java.lang.System.getProperty("log4j2.configurationFile") is not None:
        return False
    try:
        conf._jconf.initializeLogIfNecessary(False, True)  # (silent: no banner)
        jvm.org.apache.spark.util.Utils.setLogLevel(
            jvm.org.apache.logging.log4j.Level.toLevel(spark_log_level()))
    except Exception as e:  # another Spark: its own logging, as before
        log.debug("Spark's log level not set early: %s", e)
    return True


def default_master(num_tasks: int) -> str:
    """``local[N]``: a slot for every task of the job (slots need not be cores)
    and at least one per core, for the rest of the user's Spark work."""
    return f"local[{max(num_tasks, os.cpu_count() or 1)}]"


def is_local(sc: Any) -> bool:
    """Every executor runs on this machine (``local[...]``, ``local-cluster[...]``)."""
    return is_local_master(str(sc.master))


def is_local_master(master: str) -> bool:
    return master.startswith("local")


def task_slots(sc: Any) -> int:
    """How many tasks the application can run at once: what a barrier stage needs."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        return int(sc.defaultParallelism) // max(cpus, 1)


def check_slots(sc: Any, num_tasks: int) -> None:
    """Fail fast, instead of Spark's ~10 minutes of retries, when the barrier
    stage cannot get ``num_tasks`` slots at once (on a cluster, after
    :func:`slot_wait` seconds for executors to register)."""
    check_dynamic_allocation(sc, num_tasks)
    wait = slot_wait(sc)
    slots = await_slots(sc, num_tasks, wait)
    if slots >= num_tasks:
        return
    head = (f"the job has {num_tasks} tasks and runs them as one Spark barrier stage, which "
            f"needs {num_tasks} task slots at once, but the Spark application "
            f"(master {sc.master}) has {slots}")
    if not is_local(sc):
        raise ConfigurationError(
            f"{head}, and no more registered within {wait:g} s ({WAIT_SETTING}): give the "
            f"application at least {num_tasks} slots (executors x spark.executor.cores / "
            "spark.task.cpus; standalone: more workers, or spark.cores.max; YARN or "
            "Kubernetes: spark.executor.instances or --num-executors, and "
            "spark.executor.cores), or lower the job's parallelism")
    raise ConfigurationError(
        f"{head}. In local mode run with master "
        f"'local[{num_tasks}]' or more (slots need not match cores), e.g. "
        + ("spark-submit --master "
           f"'local[{num_tasks}]' (or lockgate run --master 'local[{num_tasks}]')"
           if "PYSPARK_GATEWAY_PORT" in os.environ else
           f"lockgate run --master 'local[{num_tasks}]' or "
           f"Pipeline.run(launcher='spark', master='local[{num_tasks}]')")
        + f"; on a cluster give the application at least {num_tasks} slots (executors x "
        "spark.executor.cores / spark.task.cpus, e.g. --num-executors and --executor-cores), "
        "or lower the job's parallelism")


def check_dynamic_allocation(sc: Any, num_tasks: int) -> None:
    """Spark refuses to run a barrier stage with dynamic allocation on (its
    DAGScheduler's ``checkBarrierStageWithDynamicAllocation``, a
    ``BarrierJobRunWithDynamicAllocationException`` when the job is
    submitted): say so before anything is submitted."""
    if not is_local(sc) and \
            sc.getConf().get("spark.dynamicAllocation.enabled", "false") == "true":
        raise ConfigurationError(
            "Spark barrier stages do not run with dynamic allocation (Spark refuses them: "
            "SPARK-24942): set spark.dynamicAllocation.enabled=false and a fixed number of "
            f"executors (spark.executor.instances) with at least {num_tasks} task slots in all")


WAIT_SETTING = "spark.scheduler.maxRegisteredResourcesWaitingTime"


def slot_wait(sc: Any) -> float:
    """Seconds to wait for task slots the application does not have yet: on a
    cluster, executors register after the session starts, or join later (a
    worker that starts, executors a cluster manager grants), and Spark's own
    setting says how long to wait for them before its first job (30 s by
    default); in local mode none come."""
    if is_local(sc):
        return 0.0
    return _seconds(sc.getConf().get(WAIT_SETTING, "30s"))


def await_slots(sc: Any, num_tasks: int, wait: float) -> int:
    """The application's task slots, once it has ``num_tasks`` or ``wait``
    seconds passed (there is no event to await: looked at twice a second)."""
    deadline = time.monotonic() + wait
    slots = task_slots(sc)
    while slots < num_tasks and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        slots = task_slots(sc)
    return slots


def rescale_slots_problem(sc: Any, num_tasks: int, slots: int, waited: float,
                          vertices: int) -> str:
    """Why a running job cannot be rescaled to ``num_tasks`` tasks (of
    ``vertices`` vertices) when the application has ``slots`` task slots, and
    what to do."""
    most = f"rescale to at most {slots} tasks in all"
    if slots >= vertices:
        most += f" (parallelism {slots // vertices} for every operator of its {vertices} vertices)"
    head = (f"its barrier stage needs {num_tasks} task slots at once, but the Spark "
            f"application (master {sc.master}) has {slots}")
    if is_local(sc):
        return (f"{head}, and a local session's slots are fixed when it starts: run the job "
                f"with master 'local[{num_tasks}]' or more (lockgate run --master "
                f"'local[{num_tasks}]' or Pipeline.run(master=...); slots need not match "
                f"cores), or {most}")
    return (f"{head}, and no more registered within {waited:g} s ({WAIT_SETTING}). Give the "
            "application more executors (standalone: start another worker, or raise "
            "spark.cores.max; YARN or Kubernetes: spark.executor.instances, or "
            f"--num-executors), then ask again; raise {WAIT_SETTING} to wait longer for "
            f"them; or {most}")


def _seconds(value: str) -> float:
    value = value.strip().lower()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("min", 60.0), ("m", 60.0), ("h", 3600.0)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)
