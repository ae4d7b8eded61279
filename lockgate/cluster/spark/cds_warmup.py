"""The class-data archive's warm-up: ``python -m lockgate.cluster.spark.cds_warmup
TMP OPTIONS``, run by the builder (:mod:`lockgate.cluster.spark.cds`), whose JVM
writes the archive ``TMP`` as it exits."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lockgate.cluster.spark import session as spark_session
from lockgate.cluster.spark.cds import SWITCH, WARMUP_TIMEOUT


def _warmup(tmp: str, options: str) -> int:
    """The process whose JVM writes the archive at its exit: a SparkContext
    on ``local[2]``, one barrier job through Lockgate's Spark daemon, then a
    clean stop, waiting for the JVM to exit (it writes the archive as it
    exits). Returns the JVM's exit code."""
    os.environ[SWITCH] = "0"
    os.environ["LOCKGATE_SPARK_LAUNCHER"] = "1"  # a one-off command: not worth learning
    os.environ["LOCKGATE_SPARK_JAVA_OPTIONS"] = f"{options} -XX:ArchiveClassesAtExit={tmp}"
    sc = spark_session.spark_context(None, "local[2]", 2, "lockgate-cds-warmup")
    sc.parallelize([0, 1], 2).barrier().mapPartitions(_probe).collect()
    Path(f"{tmp}.cp").write_text(str(sc._jvm.System.getProperty("java.class.path")))
    proc: Any = sc._gateway.proc
    sc.stop()
    sc._gateway.shutdown()
    proc.stdin.close()  # the gateway JVM exits when its stdin closes, and dumps
    return int(proc.wait(WARMUP_TIMEOUT))


def _probe(it: Iterator[int]) -> Iterator[int]:
    from pyspark import BarrierTaskContext

    BarrierTaskContext.get().barrier()
    yield sum(it)


if __name__ == "__main__":
    sys.exit(_warmup(sys.argv[1], sys.argv[2]))
