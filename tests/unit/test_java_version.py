"""``java -version`` runs once per Java runtime: the version is kept in the
user's cache folder by the executable's path, size and time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lockgate.cluster.spark.java import java_version

FAKE = """#!/bin/sh
echo run >> "{runs}"
echo 'openjdk version "{version}" 2025-04-15' >&2
"""


def _fake_java(folder: Path, version: str) -> Path:
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True, exist_ok=True)
    java.write_text(FAKE.format(runs=folder / "runs", version=version))
    java.chmod(0o755)
    return java


def test_the_version_is_asked_once_per_runtime(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    java = _fake_java(tmp_path, "17.0.15")
    runs = tmp_path / "runs"
    assert java_version(str(java)) == 17
    assert java_version(str(java)) == 17
    assert runs.read_text().count("run") == 1  # the second answer came from the cache
    # a symlink to it is the same runtime
    link = tmp_path / "java-link"
    link.symlink_to(java)
    assert java_version(str(link)) == 17
    assert runs.read_text().count("run") == 1
    # an update (another file) is asked again
    _fake_java(tmp_path, "21.0.2 ")
    st = java.stat()
    os.utime(java, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert java_version(str(java)) == 21
    assert runs.read_text().count("run") == 2
    # a broken cache file is asked again, not an error
    (tmp_path / "cache" / "lockgate" / "java-versions.json").write_text("[1, 2")
    assert java_version(str(java)) == 21
    assert runs.read_text().count("run") == 3
    # no answer is not kept: a java that does not run is tried again
    assert java_version(str(tmp_path / "missing" / "java")) is None


def test_spark_java_home_runs_java_without_the_incubator_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JAVA_HOME Spark gets: the real runtime's entries, and a ``java``
    that drops ``--add-modules=jdk.incubator.vector`` (no warning)."""
    import subprocess

    from lockgate.cluster.spark.java import ensure_java, spark_java_home, wrapped_java

    real = ensure_java()  # (the machine's runtime, behind its mirror)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = Path(spark_java_home(real))
    assert home.is_relative_to(tmp_path / "cache")
    java = home / "bin" / "java"
    assert wrapped_java(str(java)) == os.path.realpath(wrapped_java(real))
    assert (home / "lib").resolve() == Path(wrapped_java(real)).resolve().parent.parent / "lib"
    run = subprocess.run([str(java), "--add-modules=jdk.incubator.vector", "-version"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "version" in run.stderr
    assert "incubator" not in run.stderr, run.stderr
    # the real java would have warned
    bare = subprocess.run([wrapped_java(str(java)), "--add-modules=jdk.incubator.vector",
                           "-version"], capture_output=True, text=True, timeout=60)
    assert "Using incubator modules" in bare.stderr or bare.returncode != 0
    # a JAVA_HOME that is a mirror already gives the same mirror, not one of it
    assert spark_java_home(str(java)) == str(home)
