"""The driver JVM of a session Lockgate starts, without Spark's launcher JVM.

PySpark starts its JVM through ``spark-submit``: two bash scripts, then a
first JVM (``org.apache.spark.launcher.Main``) that only prints the command
of the second, the real one. That is a third of a second of every cold
start, for a command that is the same every time. Lockgate learns it once:

Step 1. The first session (for a *key*: the Java runtime, Spark's files,
        the Spark and Java variables of the environment, the driver's JVM
        options) starts as PySpark starts it. Its JVM's command line and
        environment are read from ``/proc`` and kept in the user's cache
        folder when they have the expected shape: ``<java and its options>
        org.apache.spark.deploy.SparkSubmit --conf k=v ... pyspark-shell``,
        with exactly the session's settings as ``--conf`` pairs.
Step 2. Later sessions of the same key run that command with their own
        settings, and the variables the scripts had added to the
        environment; PySpark then connects to the JVM as it does under
        ``spark-submit`` (``launch_gateway`` with ``PYSPARK_GATEWAY_PORT``).

Not used (PySpark's own start) when a ``spark-env.sh`` exists (the scripts
run it: what it sets may change from run to run), for settings other than
the ones Lockgate gives its local sessions, or with ``LOCKGATE_SPARK_LAUNCHER=1``.
A learned command whose JVM does not come up is forgotten, and PySpark's own
start follows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lockgate.cluster.spark.java import INCUBATOR, file_stamp, pyspark_install
from lockgate.cluster.spark.java import cache_dir as lockgate_cache_dir

log = logging.getLogger("lockgate.driver")

SWITCH = "LOCKGATE_SPARK_LAUNCHER"
"""``1``: always start the JVM through ``spark-submit``."""
WARM_UP_SWITCH = "LOCKGATE_SPARK_WARMUP"
"""``0`` turns off :func:`warm_up`."""
SUBMIT = "org.apache.spark.deploy.SparkSubmit"
KEEP = 16
"""Learned commands kept (the newest)."""
_ENV_PREFIXES = ("SPARK_", "PYSPARK_", "HADOOP_", "YARN_", "JAVA_", "_JAVA", "_SPARK",
                 "CLASSPATH", "JDK_")
_VOLATILE = ("_PYSPARK_DRIVER_CONN_INFO_PATH", "PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT",
             "PYSPARK_GATEWAY_SECRET")


def enabled() -> bool:
    return os.environ.get(SWITCH, "0").strip().lower() not in ("1", "on", "true", "yes")


def cache_file(java: str) -> Path | None:
    """Where the command of this key is kept, or None when the fast start
    does not apply (a ``spark-env.sh``, another ``PYSPARK_SUBMIT_ARGS``)."""
    java_options = submit_options()
    if java_options is None or not enabled():
        return None

    version, package = pyspark_install()  # (not imported: the JVM starts first)
    spark_home = Path(os.path.realpath(os.environ.get("SPARK_HOME") or package))
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or spark_home / "conf")
    if (conf_dir / "spark-env.sh").exists():
        return None
    digest = hashlib.sha256()
    java = os.path.realpath(java)
    jars = spark_home / "jars"
    parts: list[Any] = [java, file_stamp(Path(java)), version, str(spark_home),
                        java_options, file_stamp(conf_dir / "spark-defaults.conf"),
                        file_stamp(jars),
                        sorted((k, v) for k, v in os.environ.items()
                               if k.startswith(_ENV_PREFIXES) and k not in _VOLATILE)]
    digest.update(repr(parts).encode())
    return lockgate_cache_dir() / "spark-launch" / f"{digest.hexdigest()[:20]}.json"


def submit_options() -> str | None:
    """The driver's JVM options in ``PYSPARK_SUBMIT_ARGS`` as Lockgate sets
    them (``--driver-java-options '...' pyspark-shell``), or None for any
    other shape."""
    try:
        args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    except ValueError:
        return None
    if len(args) == 3 and args[0] == "--driver-java-options" and args[2] == "pyspark-shell":
        return args[1]
    return None


def _expected(settings: dict[str, str], java_options: str) -> dict[str, str]:
    return {**settings, "spark.driver.extraJavaOptions": java_options}


def learn(gateway: Any, settings: dict[str, str], path: Path | None,
          before: dict[str, str]) -> bool:
    """After PySpark started the JVM: keep its command in ``path`` (the
    :func:`cache_file` from before the start) with the variables the scripts
    added to the environment ``before`` it, if they have the expected shape.
    Returns whether kept."""
    options = submit_options()
    proc = getattr(gateway, "proc", None)
    if options is None or proc is None or path is None or not enabled():
        return False
    try:
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode().split("\0")[:-1]
    except (OSError, UnicodeDecodeError):
        return False
    if SUBMIT not in argv:
        return False
    cut = argv.index(SUBMIT) + 1
    prefix, rest = argv[:cut], argv[cut:]
    if rest[-1:] != ["pyspark-shell"] or len(rest) % 2 != 1 \
            or any(flag != "--conf" for flag in rest[:-1:2]):
        return False
    pairs = dict(item.split("=", 1) for item in rest[1:-1:2] if "=" in item)
    if pairs != _expected(settings, options):
        return False
    env = dict(item.split("=", 1) for item in environ if "=" in item)
    added = {k: v for k, v in env.items() if before.get(k) != v and k not in _VOLATILE}
    removed = sorted(k for k in before if k not in env and k not in _VOLATILE)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"prefix": prefix, "added": added, "removed": removed}))
        os.replace(tmp, path)
        learned = sorted(path.parent.glob("*.json"), key=lambda f: f.stat().st_mtime)
        for old in learned[:-KEEP]:  # other Javas, checkouts, options
            old.unlink(missing_ok=True)
    except OSError:
        return False
    return True


class Started:
    """A driver JVM started from a learned command, not connected yet."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: str, path: Path) -> None:
        self.proc = proc
        self.folder = folder
        self.info = os.path.join(folder, "info")
        self.path = path

    def abandon(self) -> None:
        """The session is not wanted after all (the job was refused)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        _remove(self.folder)


def spawn(settings: dict[str, str], path: Path | None) -> Started | None:
    """Start the driver JVM from the command learned in ``path`` (without
    waiting for it); None when there is none (or it does not run: then it
    is forgotten)."""
    options = submit_options()
    if options is None or path is None or not enabled():
        return None
    try:
        learned = json.loads(path.read_text())
        prefix: list[str] = list(learned["prefix"])
        added: dict[str, str] = dict(learned["added"])
        removed: list[str] = list(learned["removed"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    command = [arg for arg in prefix if arg != INCUBATOR]  # (learned before it was left out)
    for key, value in _expected(settings, options).items():
        command += ["--conf", f"{key}={value}"]
    command.append("pyspark-shell")
    folder = tempfile.mkdtemp(prefix="lockgate-gateway-")
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env.update(added)
    env["SPARK_CONNECT_MODE"] = "0"
    env["_PYSPARK_DRIVER_CONN_INFO_PATH"] = os.path.join(folder, "info")
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env,
                                preexec_fn=_ignore_sigint)  # as PySpark: Ctrl-C is Python's
    except OSError as e:
        log.info("the learned JVM command does not run (%s); starting it through "
                 "spark-submit", e)
        path.unlink(missing_ok=True)
        _remove(folder)
        return None
    return Started(proc, folder, path)


def connect(started: Started, timeout: float = 120.0) -> Any:
    """Wait for the JVM of :func:`spawn` and connect PySpark to it; the
    gateway, or None when it did not come up (the command is forgotten)."""
    proc = started.proc
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not os.path.isfile(started.info) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        if not os.path.isfile(started.info):
            log.info("the JVM from the learned command did not start (exit %s); "
                     "starting it through spark-submit", proc.poll())
            started.abandon()
            started.path.unlink(missing_ok=True)
            return None
        try:
            return _connect(proc, started.info)
        except BaseException:
            started.abandon()
            raise
    finally:
        _remove(started.folder)


def launch(settings: dict[str, str], path: Path | None, timeout: float = 120.0) -> Any:
    """:func:`spawn` and :func:`connect`: the gateway, or None."""
    started = spawn(settings, path)
    return connect(started, timeout) if started is not None else None


def _remove(folder: str) -> None:
    for leftover in (os.path.join(folder, "info"), folder):
        try:
            os.rmdir(leftover) if leftover == folder else os.unlink(leftover)
        except OSError:
            pass


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _connect(proc: subprocess.Popen[bytes], info: str) -> Any:
    """PySpark's own connection to a running JVM (as under spark-submit)."""
    from pyspark.java_gateway import launch_gateway
    from pyspark.serializers import UTF8Deserializer, read_int

    with open(info, "rb") as f:
        port = read_int(f)
        secret = UTF8Deserializer().loads(f)
    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = secret
    try:
        gateway = launch_gateway()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    gateway.proc = proc
    return gateway


class WarmUp(threading.Thread):
    """JVM work of the session's first Spark job that needs no SparkContext,
    done on a second py4j connection while the context starts (its start
    leaves part of the machine's second core idle): the JSON mapper of
    Spark's RDD operation scopes (Jackson and its Scala module, about 0.1 s
    of the first job on the 2-core machine), and the LZ4 codec and xxHash
    (native libraries) of the task's broadcast."""

    def __init__(self, gateway: Any) -> None:
        super().__init__(daemon=True, name="spark-warm-up")
        self.gateway = gateway
        self.error: str | None = None
        self.seconds: float | None = None
        """How long it took (None: not done)."""

    def run(self) -> None:
        start = time.monotonic()
        try:
            jvm = self.gateway.jvm
            scope = jvm.org.apache.spark.rdd.RDDOperationScope.fromJson(
                '{"id":"0","name":"lockgate-warm-up"}')
            scope.toJson()
            jvm.net.jpountz.lz4.LZ4Factory.fastestInstance()
            jvm.net.jpountz.xxhash.XXHashFactory.fastestInstance()
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"[:500]
            log.debug("the Spark warm-up failed: %s", self.error)
        self.seconds = time.monotonic() - start


last_warm_up: WarmUp | None = None
"""The last :func:`warm_up` started (tests look at it)."""


def warm_up(gateway: Any) -> WarmUp | None:
    """Start :class:`WarmUp` on ``gateway`` (a JVM whose context is about to
    start), unless ``LOCKGATE_SPARK_WARMUP=0``."""
    global last_warm_up
    if os.environ.get(WARM_UP_SWITCH, "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    thread = last_warm_up = WarmUp(gateway)
    thread.start()
    return thread
