"""The class-data-sharing archive of the Spark driver's JVM: which archive a
session maps, and that a cut-short or foreign one is never mapped (it would
crash the JVM with SIGBUS) but refused by the check, in a JVM of its own."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from lockgate.cluster.spark import cds as spark_cds
from lockgate.cluster.spark.java import ensure_java

OPTIONS = "-XX:TieredStopAtLevel=1"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(spark_cds.SWITCH, raising=False)
    folder = spark_cds.cache_dir()
    folder.mkdir(parents=True)
    assert folder == tmp_path / "cache" / "lockgate" / "spark-cds"
    return folder


def _install(key: str, content: bytes, size: int | None = None) -> Path:
    """An archive in the cache as the builder leaves it: the file, then its size."""
    archive = spark_cds.cache_dir() / f"spark-{key}.jsa"
    archive.write_bytes(content)
    (spark_cds.cache_dir() / f"spark-{key}.json").write_text(
        json.dumps({"size": len(content) if size is None else size}))
    return archive


def _no_builder(key: str) -> None:
    """A recent failed build: java_options starts no background build."""
    (spark_cds.cache_dir() / f"spark-{key}.failed").write_text("test\n")


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dynamic archive (of ``java -version``: made in about a second)."""
    java = ensure_java()
    path = tmp_path_factory.mktemp("jsa") / "small.jsa"
    out = subprocess.run([java, f"-XX:ArchiveClassesAtExit={path}", "-version"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and path.exists(), out.stderr
    return path


def test_an_archive_is_used_only_when_complete(cache: Path) -> None:
    key = "k1"
    assert spark_cds.usable(key) is None  # nothing yet
    body = spark_cds.MAGIC + os.urandom(4096)
    archive = _install(key, body)
    assert spark_cds.usable(key) == archive
    # cut short (a writer killed mid-way, a full disk): its size is not the recorded one
    with open(archive, "r+b") as f:
        f.truncate(1000)
    assert spark_cds.usable(key) is None
    # the right size but not an archive
    _install(key, b"\0" * 4100)
    assert spark_cds.usable(key) is None
    # an archive without its recorded size (the builder wrote it last) is not used
    _install(key, body)
    (cache / f"spark-{key}.json").unlink()
    assert spark_cds.usable(key) is None
    (cache / f"spark-{key}.json").write_text("{not json")
    assert spark_cds.usable(key) is None


def test_java_options_map_the_archive_of_the_key(cache: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    java = ensure_java()
    key = spark_cds.archive_key(java, OPTIONS)
    assert key == spark_cds.archive_key(os.path.realpath(java), OPTIONS)
    assert key != spark_cds.archive_key(java, OPTIONS + " -Xmx2g")
    _no_builder(key)
    assert spark_cds.java_options(java, OPTIONS) == ""
    archive = _install(key, spark_cds.MAGIC + b"x" * 100)
    options = spark_cds.java_options(java, OPTIONS)
    assert f"-XX:SharedArchiveFile={archive}" in options.split()
    assert "-Xlog:cds=off" in options.split()  # no JVM warning if it cannot use it
    monkeypatch.setenv(spark_cds.SWITCH, "0")
    assert spark_cds.java_options(java, OPTIONS) == ""
    monkeypatch.setenv(spark_cds.SWITCH, "1")
    with open(archive, "r+b") as f:  # truncated after the fact: not mapped
        f.truncate(50)
    assert spark_cds.java_options(java, OPTIONS) == ""


def test_one_builder_at_a_time_and_none_soon_after_a_failure(cache: Path) -> None:
    key = "k2"
    with spark_cds._locked(cache / f"spark-{key}.lock") as held:
        assert held
        assert not spark_cds.start_builder(key, OPTIONS)  # another holds the lock
        with spark_cds._locked(cache / f"spark-{key}.lock") as again:
            assert not again
    failed = cache / f"spark-{key}.failed"
    failed.write_text("the warm-up exited 1\n")
    assert not spark_cds.start_builder(key, OPTIONS)
    old = time.time() - spark_cds.RETRY_AFTER - 60
    os.utime(failed, (old, old))
    # a foreground build of the same key waits for nobody: it refuses while locked
    with spark_cds._locked(cache / f"spark-{key}.lock"):
        assert spark_cds._build(key, OPTIONS, None) is None


def test_prune_keeps_the_newest_archives(cache: Path) -> None:
    now = time.time()
    for i in range(5):
        archive = _install(f"p{i}", spark_cds.MAGIC + bytes(10))
        os.utime(archive, (now - 100 * (5 - i), now - 100 * (5 - i)))
    removed = spark_cds.prune(keep=3)
    assert sorted(p.name for p in removed) == ["spark-p0.jsa", "spark-p1.jsa"]
    assert sorted(p.name for p in cache.glob("*.jsa")) == [
        "spark-p2.jsa", "spark-p3.jsa", "spark-p4.jsa"]
    assert not (cache / "spark-p0.json").exists()


def test_the_check_refuses_a_truncated_archive_without_crashing(
        small_archive: Path, tmp_path: Path) -> None:
    java = ensure_java()
    assert spark_cds.check_archive(small_archive, "", java) is None
    # Truncated: mapping it is a SIGBUS in the JVM (exit 134), even with
    # -Xshare:auto; the check's JVM crashes, not the caller.
    cut = tmp_path / "cut.jsa"
    cut.write_bytes(small_archive.read_bytes()[: small_archive.stat().st_size // 2])
    reason = spark_cds.check_archive(cut, "", java)
    assert reason is not None and "cannot map" in reason, reason
    crashed = subprocess.run([java, f"-XX:SharedArchiveFile={cut}", "-version"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert crashed.returncode != 0  # what the check keeps sessions from
    # not an archive at all
    junk = tmp_path / "junk.jsa"
    junk.write_bytes(b"\0" * 1000)
    assert "not a dynamic class-data archive" in (spark_cds.check_archive(junk, "", java) or "")
